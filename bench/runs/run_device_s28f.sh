#!/bin/bash
# Runs on commit f564861 (its kernels and bench options were measured and reverted in the commit after it).
# Session 28, one H200 (≈ 2 min): deeper cp.async rings (Nsight Compute, s28e: the GLU at 52 % tensor pipe even
# with the widening replaced by a bit cast, 4.00 vs 4.7 ms; the two-warpgroup kernels stall on their barrier after
# each half's wait): 5 and 6 slots of 64-wide K halves for the default GLU, the split GLU (256-token tiles) and
# the down GEMM.
source bench/runs/lib.sh
timeout 150 python3 bench/bench_moe_wide_shapes.py --ms 8192,16384 --shapes 64,4,reg,4 64,4,reg,5 128,8,reg,5 \
  128,8,reg,6 2>&1 | tail -9
timeout 150 python3 bench/bench_moe_wide_shapes.py --bm 256 --ms 8192 --shapes 128,8,split,4 128,8,split,5 \
  128,8,split,6 2>&1 | tail -4
