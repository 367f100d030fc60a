#!/bin/bash
# Session 3, last check: model GPU tests, then 8 Flash layers (whole-step graphs, paged FP8) with the
# MTP draft and verify steps now on the fixed-shape path.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 100 python3 -m pytest -q -p no:cacheprovider --tb=short -x tests/gpu/test_model_gpu.py -k "paged or graph or embedded" \
    > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -6
timeout 90 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/verify_1k.json 2>&1 | grep -v Warn | tail -3
