#!/bin/bash
# Session 17, one H200: the GEMV's picks from s17b's sweep and its float32-scale W8A16 rounding: kernel tests,
# then the 8-layer decode rows with the GEMV off and on in the same call.
source bench/runs/lib.sh
run 130 tests/gpu/test_grouped_w8a16.py tests/gpu/test_fp8_gemv.py tests/gpu/test_fused_fp8_linears_gpu.py
for flag in False True; do
  echo "GEMV=$flag"
  rows8 95 1,8 dsv4.kernels.linear_config.GEMV=$flag
done
