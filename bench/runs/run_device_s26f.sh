#!/bin/bash
# Session 26, one H200 (given inline to the device tool, kept here): the ceilings (copy, bf16, FP8 tensorwise and
# blockwise matmul peaks) and the Flash MoE call at M = 8192 with mixed tiles (default) and 128-row tiles.
export PYTHONUNBUFFERED=1
timeout 60 python3 -c "import sys; sys.path.insert(0,'.'); from bench.bench_gemm_moe import ceilings; \
print('ceilings', {k: round(v, 2) for k, v in ceilings().items()})"
timeout 100 python3 bench/bench_moe_flags.py --ms 8192 "default:" \
  "128-row tiles:dsv4.kernels.moe_config.MIXED_MIN_PAIRS_PER_EXPERT=1073741824" 2>&1 | tail -2
