#!/bin/bash
# Session 24, one H200: the one-row GEMV's launch shapes from the s24b re-sweep (`linear_config.GEMV_PICKS` 24:
# 32 rows x 4 K blocks, wo_b on the GEMV) against session 17's (GEMV_PICKS = 17) in the model's 8-layer rows,
# alternating; the GEMV / linear GPU tests under the new picks; the Pro shapes' sweep (picks made on Flash's).
source bench/runs/lib.sh
run 200 tests/gpu/test_fp8_gemv.py tests/gpu/test_fused_fp8_linears_gpu.py tests/gpu/test_grouped_w8a16.py
for v in 17 24 17 24; do echo "GEMV_PICKS=$v"; rows8 90 1,8 dsv4.kernels.linear_config.GEMV_PICKS=$v; done
timeout 120 python3 bench/sweep_gemv.py --models pro 2>&1 | grep -E "^pro|copy|rror" | cut -c1-190
