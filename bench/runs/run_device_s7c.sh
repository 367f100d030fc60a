#!/bin/bash
# Session 7, call 3: GPU tests of the new defaults (tensor-core per-pair MoE at decode sizes, W8A16
# split rule) and of the files call 2 did not reach, then 8 Flash layers' decode B = 1/8/64 + prefill 8K
# and the B = 1 step's kernels in launch order.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 250 python3 -m pytest -q --maxfail=6 -p no:cacheprovider tests/gpu/test_moe_gemv_mma.py tests/gpu/test_model_gpu.py \
    tests/gpu/test_grouped_w8a16.py tests/gpu/test_fused_fp8_linears_gpu.py tests/gpu/test_router.py tests/gpu/test_moe.py \
    2>&1 | grep -v "^\.\+ *\[" | tail -25
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|copy"
timeout 60 python3 bench/profile_step.py --layers 4 --order 2>&1 | grep -v Warn > $OUT/order.txt
head -2 $OUT/order.txt
