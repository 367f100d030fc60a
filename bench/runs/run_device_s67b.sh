#!/bin/bash
# Session 67 (≈ 6-8 min with the start; carry [".whl"]). The MTP catch-up launched before the verdict
# (spec_decode.EARLY_CATCH_UP, default on): (1) the GPU tests that run speculation (engine, model, mixed steps);
# (2) the speculative step through the engine, 8 Flash layers, one draft, B = 1 and 8, the catch-up after the
# verdict ("late") and before it ("device"), alternating over 3 rounds; the ceilings of the same run first.
source bench/runs/lib.sh
with_llguidance
nvidia-smi --query-gpu=name --format=csv,noheader
runpar 300 6 tests/gpu/test_engine_gpu.py tests/gpu/test_model_gpu.py tests/gpu/test_mixed_steps_gpu.py
timeout 240 python3 bench/bench_engine_step.py --batches 1,8 --speculative 1 --drafts early --overlap off --steps 32 \
  --repeat 3 > $OUT/s67b_step.txt 2>&1
grep -E "ceilings|H100|H200|^B \||^[0-9]+ \||rror" $OUT/s67b_step.txt | tail -20
# where the GPU waits for the host in the speculative step at B = 1, late and early (profiler: compare parts)
timeout 150 python3 bench/bench_engine_step.py --batches 1 --speculative 1 --drafts early --overlap off --steps 16 \
  --timeline > $OUT/s67b_timeline.txt 2>&1
grep -E "^---|idle|rror" $OUT/s67b_timeline.txt | head -12
