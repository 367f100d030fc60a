#!/bin/bash
# Session 26, one H200: mixed tiles as the default from 128 pairs per expert (moe_config.MIXED_MIN_PAIRS_PER_EXPERT):
# their tests, the end-to-end GPU tests (the prefill MoE kernel's tile indexing changed), and the MoE call with and
# without them, alternating.
source bench/runs/lib.sh
run 120 tests/gpu/test_moe_wide.py -k "mixed"
OFF=dsv4.kernels.moe_config.MIXED_MIN_PAIRS_PER_EXPERT=1073741824
timeout 100 python3 bench/bench_moe_flags.py --ms 8192,16384 "default:" "128-row tiles:$OFF" "default again:" \
  2>&1 | tail -3
run 280 tests/gpu/test_model_gpu.py
