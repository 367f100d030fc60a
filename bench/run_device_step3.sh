#!/bin/bash
# Device call 3 (session 3): kernel tests of the fused cache writes + the paged-step model tests, a
# per-part kernel profile of one eager step, then 8 Flash layers as whole-step CUDA graphs.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 150 python3 -m pytest -q -p no:cacheprovider --tb=short -s tests/gpu/test_cache_store.py \
    tests/gpu/test_model_gpu.py -k "store or pool or paged or graph" > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|assert|differ|rel " $OUT/tests.log | tail -14
timeout 90 python3 bench/profile_step.py 2>&1 | grep -v Warn | tail -42
B="python3 bench/bench_parallel.py --world 1 --layers 8 --batches ${BATCHES:-1,8,64} --reps 4"
timeout 200 $B --cuda-graphs --kv-dtype fp8 --prefill 8192 --json $OUT/flash8_step_graphs.json 2>&1 | grep -v Warn | tail -5
