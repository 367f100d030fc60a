#!/bin/bash
# Prepared in session 67 (≈ 6 min with the start; carry [".whl"]). Sampled rows on the MTP device path
# (spec_decode.SAMPLED_ON_DEVICE, opt-in): (1) the engine's GPU tests with it on (the new
# test_sampled_speculation_on_the_device, and the rest with DSV4_SAMPLED_ON_DEVICE=1); (2) a speculative step with
# sampled requests (temperature 0.8, no seeds), draws on the host against the device, alternating, B = 1 and 8,
# one and two drafts. If the tests pass and the device path is not slower, make it the default.
source bench/runs/lib.sh
with_llguidance
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_SAMPLED_ON_DEVICE=1  # (the bench below sets the flag per mode itself)
runpar 300 6 tests/gpu/test_speculation_gpu.py tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py \
  tests/gpu/test_mixed_steps_gpu.py
unset DSV4_SAMPLED_ON_DEVICE
for k in 1 2; do
  timeout 150 python3 bench/bench_engine_step.py --batches 1,8 --speculative $k --drafts both --temperature 0.8 \
    --overlap off --steps 24 --repeat 2 > $OUT/s68b_k$k.txt 2>&1
  grep -E "ceilings|^B \||^[0-9]+ \||rror" $OUT/s68b_k$k.txt | tail -6
done
