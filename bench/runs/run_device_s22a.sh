#!/bin/bash
# Session 22, one H200: greedy MTP drafts and verdicts on the device (one read-back per speculative step) against
# the host path; the GPU speculative test (device path = host path's drafts), then the engine-step bench,
# 8 Flash layers, 1 draft, B = 1 / 8, overlap on, same process.
source bench/runs/lib.sh
run 200 tests/gpu/test_model_gpu.py -k "speculative or overlap"
timeout 300 python3 bench/bench_engine_step.py --layers 8 --batches 1,8 --prompt 4096 --steps 24 --top 30 \
  --overlap on --speculative 1 --drafts both > $OUT/engine_mtp.txt 2>&1
grep -E "^[0-9]+ \||^B |H200|ceilings|rror" $OUT/engine_mtp.txt
