#!/bin/bash
# Session 85, one call (≈ 6 min): the GLU's finish done by the down's consumers (moe_glu_decode.FINISH_IN_DOWN,
# opt-in, never run on a GPU yet): 1. its bit-identity test and the module's other GPU tests (stop if one fails);
# 2. the MoE call at M = 1 / 2 / 4 / 8 in graphs of 16 routings, default / fold, two rounds; 3. 8 Flash layers' rows,
# B = 1 default / fold twice, B = 8 once each. Adopt only what wins at B = 1 in both rounds and loses nowhere.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F="dsv4.kernels.moe_glu_decode.FINISH_IN_DOWN=True"
gate 240 -n 4 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "default:" "fold:$F" "default:" "fold:$F" \
  2>&1 | grep -v -i warn | tail -6
rows8 150 1; rows8 100 1 $F; rows8 100 1; rows8 100 1 $F
rows8 100 8; rows8 100 8 $F
