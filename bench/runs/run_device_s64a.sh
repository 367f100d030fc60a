#!/bin/bash
# Session 64 (≈ 9 min with the start; carry [".whl"]). (Ran in s64a; the rest moved to run_device_s65a.sh.)
# (1) GPU tests: session 63's load_rows(tail=) (test_cache_store, the pieces and shared-derivation tests), and
#     session 64's one-pass mixed step (test_mixed_one_pass: against the split in kernel mode; test_mixed_steps_gpu:
#     the engine's greedy text with the split and with the one pass).
# (2) A prompt beside B decode rows at 4096 tokens of context: the split against the one pass
#     (bench_prefill_graphs.py --decode-rows B --one-pass), 8 Flash layers.
source bench/runs/lib.sh
with_llguidance
runpar 280 6 -rP tests/gpu/test_cache_store.py tests/gpu/test_prefill_pieces_gpu.py tests/gpu/test_mixed_steps_gpu.py \
  tests/gpu/test_shared_derivations_gpu.py tests/gpu/test_mixed_one_pass.py
for B in 8 32; do
  timeout 90 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 16,128,512 --reps 5 --decode-rows $B \
    --ctx 4096 --one-pass 2>&1 | grep -E "ceilings|layers|\||rror"
done
