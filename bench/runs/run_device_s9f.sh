#!/bin/bash
# (Its inline timing code became bench/bench_prefill_glue.py after the call; the same code, now shared.)
# Session 9, call 6: the indexer-query glue as one tensor-core dot per 64 rows (norm_rope SIM_FP4; s9e: 2.58 ms
# per CSA layer at 8K), its GPU tests; then a launch-shape sweep of the prefill attention at Flash's 8K shapes
# (CSA: 512 picked entries per query; HCA: 64 entries; SWA: window only), ms per call, L2 not flushed.
source "$(dirname "$0")/lib.sh"
run 120 tests/gpu/test_norm_rope.py tests/gpu/test_prefill_attention.py tests/gpu/test_indexer_scores.py
timeout 300 python3 bench/bench_prefill_glue.py --skip select --shapes 256,32,8,2 256,64,8,2 256,64,8,1 512,32,8,1 512,64,8,1 512,32,8,2 256,16,4,3 128,64,4,2
