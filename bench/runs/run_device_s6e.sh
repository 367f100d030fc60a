#!/bin/bash
# Session 6, call 5: all GPU tests after the fixes (shared expert in three launches, split heuristic,
# mHC finish side by side), 8 Flash layers' decode B = 1/8/64 and prefill 8K, and the B = 1 step's
# kernels in launch order.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 330 python3 -m pytest -q --maxfail=10 tests/gpu -p no:cacheprovider 2>&1 | tail -12
timeout 170 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|ceil|copy"
timeout 60 python3 bench/profile_step.py --layers 4 --order 2>&1 | grep -v Warn > $OUT/order.txt
head -3 $OUT/order.txt
