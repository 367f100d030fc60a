#!/bin/bash
# Session 25, one H200, last call: the cuBLAS path moved to dsv4/kernels/fp8_cublas.py (test_fp8_linear), top-k at
# Pro's index_topk 1024 (test_topk), the attention kernels (their output's inverse RoPE is norm_rope's), then
# Pro-shaped rows (4 layers: HCA, HCA, CSA, HCA) at B = 64 and at 64K context, and a second alternating round of
# the in-flight rule at B = 8 (s25c: 3.55 with it, 3.68 without).
source bench/runs/lib.sh
run 150 tests/gpu/test_fp8_linear.py tests/gpu/test_topk.py
run 90 tests/gpu/test_attention.py
F=dsv4.kernels.linear_config.GEMV_MIN_INFLIGHT
echo "Pro, B = 64 at 4K"; pro 90 64 4096 0 $F=4194304
echo "Pro, B = 1 / 8 at 64K"; pro 110 1,8 65536 0 $F=4194304
for v in 0 4194304; do echo "Pro, B = 8 at 4K, $F=$v"; pro 55 8 4096 0 $F=$v; done
