#!/bin/bash
# Session 8, call 4: GPU tests with their failures listed (call 3's summary was cut by the time limit),
# then prefill 8K of 8 Flash layers on the final MoE default (128-row wide tiles from 64 pairs per expert).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
run() {  # pytest with a time limit; prints the summary line and any failures
  timeout $1 python3 -m pytest -q -rf --tb=line -p no:cacheprovider "${@:2}" > $OUT/pytest_$1.txt 2>&1
  grep -E "passed|failed|FAILED|Error|error:" $OUT/pytest_$1.txt | grep -vE "^[.sF]+ *\[" | tail -14
}
run 150 tests/gpu/test_moe_wide.py tests/gpu/test_moe.py
run 200 tests/gpu/test_model_gpu.py tests/gpu/test_moe_gemv_mma.py tests/gpu/test_projections.py
timeout 90 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|copy"
