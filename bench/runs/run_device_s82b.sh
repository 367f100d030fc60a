#!/bin/bash
# (Measured on an H200 and removed in session 82: fp8_gemv.EARLY_W no longer exists; kept as the record of what ran.)
# Session 82: the one-row GEMV's first weight step loaded before the PDL wait (fp8_gemv.EARLY_W, opt-in).
# 1. its GPU test (bit-identical to the loads in the loop) and the GEMV's file;
# 2. 8 Flash layers' B = 1 rows (ctx 4096, paged FP8, graphs): off / on / on with Flash wq_b and wo_b (33.5 MB FP8 x
#    FP8, on the tensor-core GEMM by linear_config.GEMV_MAX_FP8_BYTES) on the GEMV too, two alternating rounds.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
E=dsv4.kernels.fp8_gemv.EARLY_W=True
BIG=dsv4.kernels.linear_config.GEMV_MAX_FP8_BYTES=67108864
runpar 150 6 tests/gpu/test_fp8_gemv.py tests/gpu/test_grouped_w8a16.py
for round in 1 2; do
  rows8 100 1
  rows8 100 1 $E
  rows8 100 1 $E $BIG
done
