#!/bin/bash
# Last device call of session 3: every GPU test, then 8 Flash layers decoding as whole-step CUDA
# graphs over paged FP8 pools (ctx 1K + 8K prefill, ctx 4K), last session's piecewise graphs over
# contiguous state side by side, and B=1 at 64K context.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -8
B="python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs"
timeout 110 $B --batches 1,8,64 --kv-dtype fp8 --prefill 8192 --json $OUT/step_1k.json 2>&1 | grep -v Warn | tail -5
timeout 80 $B --batches 1,8,64 --kv-dtype fp8 --prefill 0 --ctx 4096 --json $OUT/step_4k.json 2>&1 | grep -v Warn | tail -3
timeout 80 $B --batches 1,8,64 --kv-dtype contiguous --prefill 0 --json $OUT/piecewise_1k.json 2>&1 | grep -v Warn | tail -3
timeout 100 $B --batches 1 --kv-dtype fp8 --prefill 0 --ctx 65536 --json $OUT/step_64k.json 2>&1 | grep -v Warn | tail -2
