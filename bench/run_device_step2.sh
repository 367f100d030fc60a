#!/bin/bash
# Device call 2 (session 3): the paged-step GPU test, then 8 Flash layers as whole-step CUDA graphs.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py -k "paged or graph" \
    > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error|assert" $OUT/tests.log | tail -12
B="python3 bench/bench_parallel.py --world 1 --layers 8 --batches ${BATCHES:-1,8,64} --reps 4"
timeout 200 $B --cuda-graphs --kv-dtype fp8 --prefill 8192 --json $OUT/flash8_step_graphs.json 2>&1 | grep -v Warn | tail -6
