#!/bin/bash
# Session 21, one H200: s21c's engine table with host-computed slots on (its output was cut), whole output in $OUT.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 220 python3 bench/bench_engine_step.py --layers 8 --batches 1,8,64 --prompt 4096 --steps 32 --top 40 \
  > $OUT/engine_on.txt 2>&1
grep -E "^[0-9B] |H200|rror" $OUT/engine_on.txt
echo "DSV4_HOST_SLOTS=0:"
DSV4_HOST_SLOTS=0 timeout 150 python3 bench/bench_engine_step.py --layers 8 --batches 64 --prompt 4096 --steps 32 \
  --top 40 > $OUT/engine_off.txt 2>&1
grep -E "^[0-9B] |rror" $OUT/engine_off.txt
