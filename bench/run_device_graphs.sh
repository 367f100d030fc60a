#!/bin/bash
# One single-H200 device call: GPU model tests (incl. piecewise CUDA-graph decode vs eager), then the
# first 8 Flash layers decoding eagerly and under piecewise CUDA graphs, side by side in one run.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outg}; mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|assert" $OUT/tests.log | tail -12
B="python3 bench/bench_parallel.py --world 1 --layers 8 --batches 1,8,64 --prefill 0"
timeout 150 $B --json $OUT/flash8_eager.json 2>&1 | grep -v Warn
timeout 200 $B --cuda-graphs --json $OUT/flash8_graphs.json 2>&1 | grep -v Warn
