#!/bin/bash
# (Session 81 removed moe_glu_decode.CHAIN and its test: kept as the record of what ran; it no longer runs as is.)
# Session 80: the chained decode MoE with its unit counts moved to a signal warp (s80b: counted by the consumers it was
# 13-18 % slower). Its GPU test, then the Flash MoE call at M = 1-8, three launches vs chained, two rounds, and the
# model rows.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=dsv4.kernels.moe_glu_decode.CHAIN=True
runpar 120 4 tests/gpu/test_moe_glu_down_chain.py
grep -E "FAILED|Error|assert" $OUT/pytest_par_120.txt | head -8
timeout 90 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "three launches:" "chained:$C" \
  "three launches:" "chained:$C" 2>&1 | grep -v -i warn | tail -5
# 8 Flash layers' rows, off / on (the model's path: the router's x quantisation, the combine in the next site)
rows8 100 1,8
rows8 100 1,8 $C
