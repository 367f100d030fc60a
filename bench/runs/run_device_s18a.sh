#!/bin/bash
# Session 18, one H200: session 17's review commit (split_k_sum helper, GEMV row limit) through the GPU tests it
# touched, then the decode MoE at batch 8-64: the default against the per-pair tensor-core kernel.
source bench/runs/lib.sh
run 100 tests/gpu/test_fp8_gemv.py tests/gpu/test_grouped_w8a16.py
run 90 tests/gpu/test_moe_gemv_mma.py
timeout 150 python3 bench/sweep_moe_batch.py 2>&1 | grep -vE "Warning|warn" | tee $OUT/sweep_moe_batch.txt
run 175 tests/gpu/test_model_gpu.py
