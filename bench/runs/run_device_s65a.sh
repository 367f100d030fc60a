#!/bin/bash
# Prepared in session 64, cut in session 65 (≈ 5 min with the start; carry [".whl"]).
# (1) test_shared_derivations_gpu.py, which failed once on the H100 in s64a (pool bytes, logits equal). Suspected
#     cause: a decode step's rows with open windows raced for one trash slot. Session 65 gives each row its own trash
#     slot (paged_decode), and the test compares every page again, naming those that differ; two runs in all.
# (2) test_engine_gpu.py and test_model_gpu.py, which did not run in session 64 (session 63's load_rows(tail=) and
#     ring pooling in the engine and the model).
source bench/runs/lib.sh
with_llguidance
runpar 240 6 -rP tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_shared_derivations_gpu.py
run 70 tests/gpu/test_shared_derivations_gpu.py
# (3) Mixed steps in one pass where the decode rows fit in the chunk's bucket (mixed_steps.ONE_PASS_MIXED_STEPS =
#     "same-bucket"): B = 8 rows beside prompts of 100 / 200 / 480 tokens (buckets 128 / 256 / 512 either way),
#     split against one pass, 8 Flash layers at 4096 tokens of context.
timeout 100 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 100,200,480 --reps 5 --decode-rows 8 \
  --ctx 4096 --one-pass 2>&1 | grep -E "ceilings|layers|\||rror"
