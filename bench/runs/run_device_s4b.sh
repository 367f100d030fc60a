#!/bin/bash
# Session 4, second device call: prefill attention kernel + sort-based moe_align + swap-AB MoE default:
# kernel tests and the model's GPU tests, an 8K prefill profile, 8 Flash layers decode + 8K prefill.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 260 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_prefill_attention.py tests/gpu/test_moe.py \
    tests/gpu/test_model_gpu.py tests/gpu/test_attention.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|e2e" $OUT/tests.log | tail -14
TOP=20 timeout 120 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -v Warn | tail -36
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step_1k.json 2>&1 | grep -v Warn | tail -5
