#!/bin/bash
# One single-H200 device call: GPU model tests of the piecewise CUDA-graph decode (vs eager), then
# the first 8 Flash layers decoding under CUDA graphs and eagerly, side by side in one run.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outg}; mkdir -p $OUT
timeout 90 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py -k "cuda_graph" \
    > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error|assert" $OUT/tests.log | tail -12
B="python3 bench/bench_parallel.py --world 1 --layers 8 --batches 1,8,64 --prefill 0 --reps 4"
timeout 75 $B --cuda-graphs --json $OUT/flash8_graphs.json 2>&1 | grep -v Warn | tail -5
timeout 60 $B --json $OUT/flash8_eager.json 2>&1 | grep -v Warn | tail -4
