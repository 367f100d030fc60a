#!/bin/bash
# Prepared in session 65 (≈ 8-9 min with the start; carry [".whl"]).
# (1) GPU tests: test_engine_gpu.py and test_model_gpu.py (s65a's run was cut by its limit after 25 passed, none
#     failed), and the mixed-step tests now that the one pass is the default where the rows fit the bucket.
# (2) That one pass at B = 32 (P + 32 in P's bucket: 90 / 220 / 470 tokens), split against one pass, 8 Flash layers
#     at 4096 tokens of context; then through the engine while 100-token prompts arrive at B = 8 (the split against
#     ONE_PASS_MIXED_STEPS = "same-bucket"; every arrival fits the 128 bucket beside the 8 rows).
# Then run_device_s65c.sh (the MoE at 3-12 pairs per expert) in a call of its own.
source bench/runs/lib.sh
with_llguidance
runpar 330 6 -rP tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_mixed_steps_gpu.py \
  tests/gpu/test_mixed_one_pass.py tests/gpu/test_prefill_pieces_gpu.py
timeout 100 python3 bench/bench_prefill_graphs.py --layers 8 --prompts 90,220,470 --reps 5 --decode-rows 32 \
  --ctx 4096 --one-pass 2>&1 | grep -E "ceilings|layers|\||rror"
timeout 120 python3 bench/bench_arrivals.py --layers 8 --batch 8 --prompt 4096 --arrival 100 --every 4 --steps 32 \
  --rounds 2 --one-pass same-bucket 2>&1 | grep -E "ceilings|layers:|\||rror"
