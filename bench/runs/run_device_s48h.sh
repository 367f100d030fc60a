#!/bin/bash
# Session 48 (≈ 1 min, the budget's end): the combine over the persistent down's fp32 partials with 256-column
# programs (was 1024: 4 programs at one token): tests, then the MoE call with the down off / on / on with 1 K range.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
timeout 100 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_moe_combine.py \
  tests/gpu/test_moe_glu_decode.py 2>&1 | tail -2
timeout 150 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "down on:$G.DOWN_ENABLED=True" \
  "down split 1:$G.DOWN_ENABLED=True,$G.DOWN_SPLIT=1" "default again:" 2>&1 | tail -4
