#!/bin/bash
# Session 35, one H200: the FP8 GEMMs of the prefill MoE (dsv4.kernels.moe_glu_fp8: moe_wide.FP8_GLU / FP8_DOWN) --
# their GPU tests, the whole Flash MoE call against the default (bench_moe_flags, L2 flushed), Nsight metrics on
# their launches at 8K, then the 8-layer 8K prefill off / on.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 150 tests/gpu/test_moe_wide.py -k "fp8_glu or fp8_operands"
F=dsv4.kernels.moe_wide
timeout 120 python3 bench/bench_moe_flags.py --ms 2048,8192 "default:" "fp8 glu:$F.FP8_GLU=True" \
  "fp8 both:$F.FP8_GLU=True,$F.FP8_DOWN=True" 2>&1 | tail -6
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL="_glu_fp8" ncu_cmd 150 4 "$M" bench/bench_moe_flags.py --ms 8192 "fp8:$F.FP8_GLU=True,$F.FP8_DOWN=True"
prefill8 100
prefill8 100 $F.FP8_GLU=True $F.FP8_DOWN=True
