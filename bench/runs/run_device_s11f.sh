#!/bin/bash
# Session 11: with the GLU on one warpgroup (s11c), do 64-row token tiles pay at M >= 4096 too (less padding:
# ~192 pairs per expert at M = 8192 fill 2 x 128 rows to 75 %), and does the wide kernel now win at M = 1024
# (24 pairs per expert)? Per-GEMM shapes at 64-row tiles, then the whole call under the two thresholds.
source "$(dirname "$0")/lib.sh"
timeout 120 python3 bench/bench_moe_wide_shapes.py --ms 4096,8192 --bm 64 --shapes 64,4,reg,4 128,8,reg,4 128,8,smem,4
timeout 150 python3 bench/bench_moe_flags.py --ms 1024,4096,8192 "default:" \
    "64-row tiles from 40 pairs/expert up:dsv4.kernels.moe_config.WIDE_MIN_PAIRS_PER_EXPERT=100000" \
    "wide kernel from 20 pairs/expert:dsv4.kernels.moe_config.WIDE64_MIN_PAIRS_PER_EXPERT=20"
