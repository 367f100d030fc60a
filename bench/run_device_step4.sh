#!/bin/bash
# Device call 4 (session 3): GPU tests of the new kernels and of the model, a per-part kernel profile
# of one eager step, then 8 Flash layers as whole-step CUDA graphs (ctx 1024 and 4096).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short -s tests/gpu/test_norm_rope.py tests/gpu/test_cache_store.py \
    tests/gpu/test_model_gpu.py tests/gpu/test_attention.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|assert|differ|rel " $OUT/tests.log | tail -16
timeout 90 python3 bench/profile_step.py 2>&1 | grep -v Warn | tail -26
B="python3 bench/bench_parallel.py --world 1 --layers 8 --batches ${BATCHES:-1,8,64} --reps 4 --cuda-graphs --kv-dtype fp8"
timeout 150 $B --prefill 8192 --json $OUT/flash8_graphs_1k.json 2>&1 | grep -v Warn | tail -5
timeout 150 $B --prefill 0 --ctx 4096 --json $OUT/flash8_graphs_4k.json 2>&1 | grep -v Warn | tail -3
