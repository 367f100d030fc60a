#!/bin/bash
# Session 24, one H200, last call: the GEMV / fused-linear GPU tests and the model's GPU tests (logits vs the CPU
# reference, graphs, speculative) on the final picks (session 17's shapes + the in-flight rule).
source bench/runs/lib.sh
run 100 tests/gpu/test_fp8_gemv.py tests/gpu/test_fused_fp8_linears_gpu.py
run 170 tests/gpu/test_model_gpu.py
