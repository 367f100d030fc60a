#!/bin/bash
# Prepared in session 48 for session 49 (≈ 2 min): the persistent decode GLU for Pro's hidden 7168 (ODD_SPLIT: 7 K
# ranges, since SPLIT 4 does not divide its 56 K blocks into whole steps per consumer): its tests, then Pro's MoE call
# with it off (the Triton GLU) / on. Never run before: a fault here ends only this call.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
gate 150 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 250 python3 bench/bench_moe_flags.py --experts pro --ms 1,2,4 --graphs 16 "default:" \
  "odd split:$G.ODD_SPLIT=True" "default again:" "odd split again:$G.ODD_SPLIT=True" 2>&1 | tail -4
