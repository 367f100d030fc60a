#!/bin/bash
# One single-H200 device call (session 3): GPU tests of the fixed-shape paged decode step, then the
# first 8 Flash layers decoding (paged FP8 pools) as whole-step CUDA graphs / eagerly, and last
# session's piecewise graphs over contiguous state, side by side in one run.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_model_gpu.py tests/gpu/test_attention.py \
    > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error|assert" $OUT/tests.log | tail -12
B="python3 bench/bench_parallel.py --world 1 --layers 8 --batches ${BATCHES:-1,8,64} --reps 4"
timeout 150 $B --cuda-graphs --kv-dtype fp8 --prefill 8192 --json $OUT/flash8_step_graphs.json 2>&1 | grep -v Warn | tail -6
timeout 100 $B --kv-dtype fp8 --prefill 0 --json $OUT/flash8_step_eager.json 2>&1 | grep -v Warn | tail -4
timeout 100 $B --cuda-graphs --kv-dtype contiguous --prefill 0 --json $OUT/flash8_piecewise.json 2>&1 | grep -v Warn | tail -4
