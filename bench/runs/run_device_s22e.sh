#!/bin/bash
# Session 22, one H200: after removing the mHC "fused" finish and the decode MoE's launch fusions, the kernel tests
# of both and the model's GPU tests; then the A/B of greedy MTP drafts on the device vs the host, 3 alternating
# rounds at B = 1 (8 Flash layers, prompt 2048, 1 draft, overlap on).
source bench/runs/lib.sh
run 360 tests/gpu/test_mhc.py tests/gpu/test_moe_gemv_mma.py tests/gpu/test_moe.py tests/gpu/test_model_gpu.py
timeout 200 python3 bench/bench_engine_step.py --layers 8 --batches 1 --prompt 2048 --steps 16 \
  --overlap on --speculative 1 --drafts both --repeat 3 > $OUT/spec_ab.txt 2>&1
grep -E "^[0-9]+ \||^B |H200|ceilings|rror" $OUT/spec_ab.txt
