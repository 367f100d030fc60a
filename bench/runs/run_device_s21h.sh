#!/bin/bash
# Session 21, one H200: what an MTP speculative engine step costs (1 draft; random weights accept few drafts, so
# this is the cost side only) next to the plain step with overlap, 8 Flash layers, B = 1 / 8, same process.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 200 python3 bench/bench_engine_step.py --layers 8 --batches 1,8 --prompt 4096 --steps 24 --top 30 \
  --overlap on --speculative 1 > $OUT/engine_mtp.txt 2>&1
grep -E "^[0-9]+ \||^B |H200|ceilings|rror" $OUT/engine_mtp.txt
