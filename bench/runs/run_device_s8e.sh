#!/bin/bash
# Session 8, call 5: graph buckets now cover the verify step (EngineConfig.decode_step_rows, buckets up to
# 128 rows, max_batch rounded up to a bucket): the model's GPU tests, then 8 Flash layers' decode, MTP draft
# and verify at B = 1/8/64 (the benchmark now sizes its graphs for 2 tokens per sequence).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 200 python3 -m pytest -q -rf --tb=line -p no:cacheprovider tests/gpu/test_model_gpu.py > $OUT/pytest.txt 2>&1
grep -E "passed|failed|FAILED|rror" $OUT/pytest.txt | grep -vE "^[.sF]+ *\[" | tail -10
timeout 200 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep -E "B=|copy"
