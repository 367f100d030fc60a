#!/bin/bash
# Session 27, one H200: the rest of test_model_gpu (s27d's 200 s limit stopped it after 13 of 18, all passed),
# then the wide kernel's new lower bound (WIDE64_MIN_PAIRS_PER_EXPERT = 24) against 16 and the old 40 below M = 1024.
source bench/runs/lib.sh
run 200 tests/gpu/test_model_gpu.py -k "speculative or paged_fp8 or side_stream"
C=dsv4.kernels.moe_config
timeout 100 python3 bench/bench_moe_flags.py --ms 512,768,1024 "default (24):" "from 16:$C.WIDE64_MIN_PAIRS_PER_EXPERT=16" \
  "from 40:$C.WIDE64_MIN_PAIRS_PER_EXPERT=40" 2>&1 | tail -4
