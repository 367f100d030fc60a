#!/bin/bash
# Session 17, one H200: the final tree (GEMV with 1-4 rows, used at one row) through the model-level GPU tests.
source bench/runs/lib.sh
run 175 tests/gpu/test_model_gpu.py
run 60 tests/gpu/test_fused_fp8_linears_gpu.py
