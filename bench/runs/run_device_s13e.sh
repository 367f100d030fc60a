#!/bin/bash
# Session 13: Nsight Compute on the kernels that dominate a Flash decode step and an 8K prefill
# (bench/ncu_kernels.py): speed of light, occupancy, issue activity, tensor pipe, stall reasons (CSV).
source bench/runs/lib.sh
M="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
M="$M,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__grid_size,launch__occupancy_limit_shared_mem"
M="$M,launch__occupancy_limit_registers,lts__t_bytes.sum,dram__bytes_read.sum"
timeout 400 ncu --csv -k regex:"_mma_glu|_mma_down|_wide_async|_wide_kernel|_mix_kernel|_grouped_w8a16|_fp8_gemm" \
  --metrics "$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 bench/ncu_kernels.py > $OUT/ncu.csv 2> $OUT/ncu.err
tail -3 $OUT/ncu.err; grep -c '"' $OUT/ncu.csv; grep "^==" $OUT/ncu.csv | tail -5
