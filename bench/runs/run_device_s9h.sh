#!/bin/bash
# Session 9, final call: GPU tests on the final tree (prefill attention with the whole head dim, the indexer-query
# glue's dot, the model's GPU-vs-CPU logits and greedy text through the new prefill indexer), then the end-to-end
# run of 8 Flash layers (decode B = 1 / 8, prefill 8K) and the 8K prefill's kernel table (4 layers).
source "$(dirname "$0")/lib.sh"
run 90 tests/gpu/test_prefill_attention.py tests/gpu/test_norm_rope.py tests/gpu/test_attention.py
run 200 tests/gpu/test_model_gpu.py
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|copy"
timeout 100 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -v -i warn | head -22
