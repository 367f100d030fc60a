#!/bin/bash
# Session 6, call 2: decode step host time vs graph replay time (8 Flash layers), and the B = 1
# step's kernels in launch order (4 layers).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
git checkout -q HEAD -- dsv4 tests  # helpers' unfinished edits stay home
python3 bench/profile_step.py --layers 4 --order 2>&1 | grep -v Warn > $OUT/order.txt
timeout 200 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep -v Warn | tail -5
