#!/bin/bash
# Session 42 (≈ 3 min): where the decode MoE kernels (B = 1: 6 pairs, GLU split 2, down no split) wait --
# Nsight's source counters per SASS instruction and the launch-level metrics of both kernels.
source bench/runs/lib.sh
for k in _mma_glu _mma_down; do
  echo "== $k"; KERNEL="$k" ncu_src 120 "src_$k" bench/bench_moe_flags.py --ms 1 "d:" | head -40
done
KERNEL="_mma_glu|_mma_down" ncu_cmd 150 2 \
  "$MMA_METRICS,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active" \
  bench/bench_moe_flags.py --ms 1 "d:"
