#!/bin/bash
# Session 48 (≈ 2.5 min): the down GEMV on the persistent kernel with its producer streaming W2 before the PDL wait
# (only the consumers wait for the GLU's z): tests, the MoE call with the down off / on, 8 Flash layers' rows.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
gate 200 tests/gpu/test_moe_glu_decode.py tests/gpu/test_moe_combine.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "down on:$G.DOWN_ENABLED=True" \
  "default again:" "down on again:$G.DOWN_ENABLED=True" 2>&1 | tail -4
rows8 100 1 "$G.DOWN_ENABLED=True" | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
rows8 100 1 | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
