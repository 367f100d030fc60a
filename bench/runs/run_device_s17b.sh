#!/bin/bash
# Session 17, one H200: the GEMV wired in for one-row linears (pick_gemv_config): kernel tests (fp8_linear /
# grouped wo_a at one row now run it, stacked pairs), the model on the GPU, the sweep with the picked configs
# and the read floor, then the 8-layer decode rows with the GEMV on and off in the same call.
source bench/runs/lib.sh
run 140 tests/gpu/test_fp8_gemv.py tests/gpu/test_fused_fp8_linears_gpu.py tests/gpu/test_grouped_w8a16.py \
  tests/gpu/test_fp8_linear.py -k "not 300"
run 170 tests/gpu/test_model_gpu.py
timeout 60 python3 bench/sweep_gemv.py --models flash 2>&1 | grep -E "^flash|copy" | cut -c1-190
for flag in True False; do
  echo "GEMV=$flag"
  rows8 95 1,8 dsv4.kernels.linear_config.GEMV=$flag
done
