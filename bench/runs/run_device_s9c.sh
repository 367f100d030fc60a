#!/bin/bash
# Session 9, call 3: where an 8K prefill's time goes now (profile of 4 Flash layers, kernel time per model
# part), and the end-to-end run on the s9a default (f16 widening): decode B = 1 / 8 and prefill 8K of 8 layers.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -v Warn > $OUT/prefill_profile.txt
head -60 $OUT/prefill_profile.txt
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|copy"
