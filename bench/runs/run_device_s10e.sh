#!/bin/bash
# Session 10: the new defaults (Gluon MoE: 128-row tiles through shared memory, 64-row tiles from 40 pairs per
# expert with register operands; prefill attention KV_ONE_LOAD with 64-key tiles) through the GPU tests of the
# MoE and the model, then #5's MoE table with the same run's ceilings, then 8 Flash layers' 8K prefill.
source "$(dirname "$0")/lib.sh"
run 200 tests/gpu/test_moe_wide.py tests/gpu/test_moe.py tests/gpu/test_model_gpu.py
timeout 200 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1024,2048,4096,8192 --no-sweep 2>&1 | grep -v -i warn | tail -30
timeout 100 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 2 --batches 1 --kv-dtype fp8 --prefill 8192 \
    2>&1 | grep -E "prefill|copy"
