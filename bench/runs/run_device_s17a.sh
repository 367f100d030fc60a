#!/bin/bash
# Session 17, one H200: the one-token CUDA-core FP8 linear (fp8_gemv) -- GPU tests, then its sweep against the
# tensor-core GEMM the model runs and a plain read of the same bytes; then where an 8K prefill goes now.
source bench/runs/lib.sh
run 150 tests/gpu/test_fp8_gemv.py
timeout 260 python3 bench/sweep_gemv.py --models flash 2>&1 | grep -vE "Warning|warn" | tail -14
timeout 120 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | tail -40
