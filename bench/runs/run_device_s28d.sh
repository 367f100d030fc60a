#!/bin/bash
# Runs on commit f564861 (its kernels and bench options were measured and reverted in the commit after it).
# Session 28, one H200 (≈ 3 min): the GLU with gate and up rows split between the tile's two warpgroups (one
# accumulator each, so a 256-token tile fits: half the widening and activation copies per MMA), against the
# default 64-row GLU; and the down GEMM with 256-token tiles. bm 256 pads each expert's pairs to 256 rows.
source bench/runs/lib.sh
timeout 150 python3 bench/bench_moe_wide_shapes.py --ms 4096,8192,16384 --shapes 64,4,reg,4 128,8,split,4 \
  2>&1 | tail -7
timeout 200 python3 bench/bench_moe_wide_shapes.py --bm 256 --ms 4096,8192,16384 --shapes 64,4,reg,4 128,8,split,4 \
  128,8,split,3 2>&1 | tail -10
