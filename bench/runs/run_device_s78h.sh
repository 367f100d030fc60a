#!/bin/bash
# Session 78: blocks of pairs with more K blocks per loop step (4 MMA columns per pair and block; up to 32 fit): two
# pairs at 4 blocks instead of 2, four pairs at 2 instead of 1, at M = 64-128 (s78c/d: M = 64 73.9 %, 96 64.8 %, 128
# 63.7 % of copy), alternating with the default. Ran with the knobs `moe_config.GEMV_PAIRS2_UNROLL` / `GEMV_PAIRS4_UNROLL`
# (both lost; removed after, the result is in moe_config's comment).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F=dsv4.kernels.moe_config
timeout 150 python3 bench/bench_moe_flags.py --ms ${MS:-64,96,128} --graphs 16 "default:" "p2u4:$F.GEMV_PAIRS2_UNROLL=4" \
  "p4u2:$F.GEMV_PAIRS4_UNROLL=2" "default:" 2>&1 \
  | grep -v -i warn | tail -7
