#!/bin/bash
# (Its inline timing code became bench/bench_prefill_glue.py after the call; the same code, now shared.)
# Session 9, call 4: the prefill indexer in two launches (dsv4.kernels.indexer_scores.prefill_index_scores +
# the radix top-k) -- GPU tests, its time against the torch path for an 8K prompt at Flash's indexer shape,
# and the end-to-end prefill 8K / decode of 8 Flash layers with it.
source "$(dirname "$0")/lib.sh"
run 100 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py
timeout 120 python3 bench/bench_prefill_glue.py --skip queries attention
run 200 tests/gpu/test_model_gpu.py
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|copy"
