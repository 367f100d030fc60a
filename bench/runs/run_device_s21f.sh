#!/bin/bash
# Session 21, one H200, the final tree: decode through the engine with overlap off / on (ceilings and roofline
# of the same run), 8 Flash layers, B = 1 / 8 / 64; then the model-level 8-layer rows (host slots by default).
source bench/runs/lib.sh
timeout 300 python3 bench/bench_engine_step.py --layers 8 --batches 1,8,64 --prompt 4096 --steps 32 --top 30 \
  > $OUT/engine_overlap.txt 2>&1
grep -E "^[0-9]+ \||^B |H200|ceilings|rror" $OUT/engine_overlap.txt
rows8 120 1,8
