#!/bin/bash
# Session 21, one H200: the engine's overlap (EngineConfig.overlap) -- its GPU test and the graph / engine tests
# around it, then decode through the engine with overlap off / on, 8 Flash layers, B = 1 / 8 / 64 (whole output
# in $OUT).
source bench/runs/lib.sh
run 260 tests/gpu/test_model_gpu.py -k "overlap or llm_with or speculative or paged or greedy_text"
timeout 280 python3 bench/bench_engine_step.py --layers 8 --batches 1,8,64 --prompt 4096 --steps 32 --top 30 \
  > $OUT/engine_overlap.txt 2>&1
grep -E "^[0-9B] |H200|rror" $OUT/engine_overlap.txt
