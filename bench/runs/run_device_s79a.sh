#!/bin/bash
# Session 78 (prepared, not run): the persistent Gluon GLU / down with blocks of two pairs of one expert per work item
# (`moe_glu_decode.PAIR_BLOCKS`, opt-in; compiled offline only: 168 registers, 8 B spilled in the GLU, 139.5 / 121 KB of
# shared memory). First its GPU test (bit-identity with the one-pair kernel), then the Flash MoE call at M = 12-64,
# where blocks of two pairs run on the Triton GEMV by default (s78c: 79-82 % of copy, M = 64 74 %), alternating; then
# 8 layers' B = 16 / 64 rows with and without. Make it the default over the range where it wins in both.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 240 tests/gpu/test_moe_glu_decode.py
G=dsv4.kernels.moe_glu_decode
timeout 200 python3 bench/bench_moe_flags.py --ms 12,16,24,32,48,64 --graphs 16 "default:" "gluon pairs:$G.PAIR_BLOCKS=True" \
  "default:" "gluon pairs:$G.PAIR_BLOCKS=True" 2>&1 | grep -v -i warn | tail -8
rows8 150 16,64
rows8 150 16,64 $G.PAIR_BLOCKS=True
