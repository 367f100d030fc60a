#!/bin/bash
# Session 7, call 1: GPU tests of the session-6 changes not yet run on the GPU (explicit-fma mHC
# collapse, split collapse, wide combine), the A/B timings for them, the W8A16 launch-shape sweep and
# 8 Flash layers' decode B = 1/8/64.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 230 python3 -m pytest -q --maxfail=10 -p no:cacheprovider tests/gpu/test_mhc.py tests/gpu/test_attention.py \
    tests/gpu/test_swiglu.py tests/gpu/test_grouped_w8a16.py tests/gpu/test_model_gpu.py 2>&1 | tail -12
timeout 90 python3 bench/bench_glue.py --attn --tokens 1,8 2>&1 | grep -v Warn | tail -40
timeout 90 python3 bench/bench_gemm_moe.py --only linear --models flash --ms 1,8,64 2>&1 | grep -v Warn | tail -40
timeout 120 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep -E "B=|copy"
