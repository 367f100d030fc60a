#!/bin/bash
# Session 48 (≈ 4 min): the persistent decode GEMV kernel launched with PDL (STREAM_PDL) and the down GEMV on it
# (DOWN_ENABLED, faster alone since the batched activation load): tests, the MoE call A/B, 8 Flash layers' rows.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
gate 200 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "no PDL:$G.STREAM_PDL=False" \
  "down on:$G.DOWN_ENABLED=True" "triton GLU:$G.ENABLED=False" "default again:" 2>&1 | tail -4
rows8 100 1,2 "$G.STREAM_PDL=False"
rows8 100 1,2
rows8 100 1,2 "$G.DOWN_ENABLED=True"
