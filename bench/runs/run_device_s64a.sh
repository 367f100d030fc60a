#!/bin/bash
# Prepared in session 63 (≈ 7-9 min with the start; carry [".whl"]).
# (1) The GPU tests of session 63's last CPU-only change: a later chunk's window keys and its own keys in one launch
#     (`cache_store.load_rows(tail=)`, `PagedLayerState.window(tail=)`); test_cache_store.py checks the kernel, the
#     model / pieces / engine tests run it in every later prompt chunk, test_shared_derivations_gpu.py bit for bit.
# (2) Serving while prompts arrive (bench/bench_arrivals.py; ran in session 63 on an H100, s63g): the mixed-step split
#     (mixed_steps.SPLIT_MIXED_STEPS, on by default since s63d) off / on, alternating twice; 8 Flash layers, B requests
#     decoding at 4096 tokens of context, a 128-token prompt arriving every 4 steps. The "steps split" column must
#     read 8 / 8 with the split on and 0 / 8 off.
source bench/runs/lib.sh
with_llguidance
runpar 420 6 -rP tests/gpu/test_cache_store.py tests/gpu/test_model_gpu.py tests/gpu/test_prefill_pieces_gpu.py \
  tests/gpu/test_engine_gpu.py tests/gpu/test_mixed_steps_gpu.py tests/gpu/test_shared_derivations_gpu.py
for B in 8 32; do
  timeout 200 python3 bench/bench_arrivals.py --layers 8 --batch $B --prompt 4096 --arrival 128 --every 4 --steps 32 \
    --rounds 2 2>&1 | grep -E "ceilings|layers:|\||rror"
done
