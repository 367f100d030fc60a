#!/bin/bash
# Prepared in session 82 (offline only), one call (≈ 6 min): the persistent down's two MMA chains per step
# (moe_glu_decode.DOWN_CHAINS, opt-in).
# 1. the decode GLU / down file (its new test: equal outputs with one or two chains) -- stop if it fails;
# 2. the Flash MoE call at M = 1-8 in graphs of 16 routings, one chain / two, two alternating rounds -- adopt
#    (DOWN_CHAINS = True) only if two chains win at M = 1 in both rounds and lose nowhere;
# 3. 8 Flash layers' B = 1 / 8 rows, off / on alternating.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=dsv4.kernels.moe_glu_decode.DOWN_CHAINS=True
gate 200 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 150 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "one chain:" "two chains:$C" "one chain:" \
  "two chains:$C" 2>&1 | grep -v -i warn | tail -6
rows8 150 1,8
rows8 100 1,8 $C
rows8 100 1,8
rows8 100 1,8 $C
