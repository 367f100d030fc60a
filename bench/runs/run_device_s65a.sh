#!/bin/bash
# Prepared in session 64 (≈ 8 min with the start; carry [".whl"]).
# (1) test_shared_derivations_gpu.py, which failed once on the H100 in s64a (pool bytes, logits equal). Suspected
#     cause: a decode step's rows with open windows raced for one trash slot. Session 65 gives each row its own trash
#     slot (paged_decode), and the test compares every page again, naming those that differ; three runs in all. test_engine_gpu.py and test_model_gpu.py did not run in
#     session 64 (session 63's load_rows(tail=) and ring pooling in the engine and the model).
# (2) Serving while prompts arrive: mixed_steps' split against its one pass (ONE_PASS_MIXED_STEPS, opt-in), 8 Flash
#     layers, B = 32 requests decoding at 4096 tokens of context, a 128-token prompt every 4 steps.
source bench/runs/lib.sh
with_llguidance
runpar 240 6 -rP tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_shared_derivations_gpu.py
for i in 1 2; do run 70 tests/gpu/test_shared_derivations_gpu.py; done
for B in 32; do
  timeout 120 python3 bench/bench_arrivals.py --layers 8 --batch $B --prompt 4096 --arrival 128 --every 4 --steps 32 \
    --rounds 2 --one-pass 2>&1 | grep -E "ceilings|layers:|\||rror"
done
