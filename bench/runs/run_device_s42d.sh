#!/bin/bash
# Session 42 (≈ 4 min): where the other decode kernels and the prefill mHC finish wait -- Nsight's source counters
# on the M = 1 FP8 GEMM (wq_b), the one-row GEMV (wo_a, W8A16), and the 8K "row" mHC finish; launch metrics of the
# 8K mix and finish.
source bench/runs/lib.sh
for k in _fp8_gemm _fp8_gemv; do
  echo "== $k"; KERNEL="$k" ncu_src 100 "src_$k" bench/ncu_kernels.py --only decode | head -24
done
echo "== _finish_kernel (8K)"; KERNEL="_finish_kernel" ncu_src 150 src_finish bench/ncu_kernels.py --only prefill \
  | head -24
KERNEL="_mix_kernel|_finish_kernel" ncu_cmd 150 2 \
  "$MMA_METRICS,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__registers_per_thread" \
  bench/ncu_kernels.py --only prefill
