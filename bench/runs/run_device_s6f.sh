#!/bin/bash
# Session 6, call 6: 8 Flash layers' decode at context 4K (B = 1/8/64) and 64K (B = 1), and where the
# host's time goes in a captured B = 1 decode step (wall vs graph replay).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 110 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --ctx 4096 \
    --kv-dtype fp8 --prefill 0 --json $OUT/step4k.json 2>&1 | grep -E "B=|copy"
timeout 90 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1 --ctx 65536 \
    --kv-dtype fp8 --prefill 0 --json $OUT/step64k.json 2>&1 | grep -E "B="
timeout 70 python3 bench/profile_step.py --layers 8 --host 2>&1 | grep -v Warn | head -40
