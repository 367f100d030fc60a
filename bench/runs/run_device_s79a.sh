#!/bin/bash
# Session 78 (prepared): the persistent Gluon GLU / down with blocks of two pairs of one expert per work item
# (`moe_glu_decode.PAIR_BLOCKS`, opt-in) and the GLU's units in runs of row tiles of one item (`UNIT_RUN`,
# `PAIR_UNIT_RUN`, default 1). Measured once (s78i, H100): blocks with runs of 1 are slower than the Triton GEMV
# (M = 16 507 vs 440 µs, M = 64 1,634 vs 1,190): a program builds a new item's activation tiles for every unit.
# First the GPU test (bit-identity with the one-pair kernel, runs of 4 included), then the Flash MoE call: the
# one-pair path at M = 2-11 with runs of 1 / 4 / 8, the blocks at M = 12-64 with runs of 4 / 8, alternating with the
# default; then 8 layers' B = 8 / 64 rows for what wins.
# (Ran in session 79 without its rows8 lines; PAIR_BLOCKS / PAIR_UNIT_RUN were removed after it: docs/benchmarks.md.)
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 240 tests/gpu/test_moe_glu_decode.py
G=dsv4.kernels.moe_glu_decode
timeout 150 python3 bench/bench_moe_flags.py --ms 2,4,8,11 --graphs 16 "default:" "run4:$G.UNIT_RUN=4" \
  "run8:$G.UNIT_RUN=8" "default:" "run4:$G.UNIT_RUN=4" 2>&1 | grep -v -i warn | tail -6
timeout 200 python3 bench/bench_moe_flags.py --ms 16,32,48,64 --graphs 16 "default:" \
  "pairs run4:$G.PAIR_BLOCKS=True,$G.PAIR_UNIT_RUN=4" "pairs run8:$G.PAIR_BLOCKS=True,$G.PAIR_UNIT_RUN=8" \
  "default:" "pairs run4:$G.PAIR_BLOCKS=True,$G.PAIR_UNIT_RUN=4" 2>&1 | grep -v -i warn | tail -6
rows8 150 8,64
rows8 150 8,64 ${BEST:-$G.UNIT_RUN=4 $G.PAIR_BLOCKS=True $G.PAIR_UNIT_RUN=4}
