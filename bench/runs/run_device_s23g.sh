#!/bin/bash
# Session 23, one H200: the kernels whose weight prefetch now depends on the weight's size, their GPU tests; the
# 8-layer rows with the new default (prefetch up to 2 MiB); then the grid barrier's test again.
source bench/runs/lib.sh
run 330 tests/gpu/test_fp8_gemv.py tests/gpu/test_grouped_w8a16.py tests/gpu/test_projections.py tests/gpu/test_pdl.py \
  tests/gpu/test_fused_fp8_linears_gpu.py tests/gpu/test_mhc.py tests/gpu/test_grid_barrier.py
echo "model, default (prefetch up to 2 MiB):"; rows8 100 1,8
echo "model, prefetch for all:"; rows8 100 1,8 dsv4.kernels._triton.PREFETCH_MAX_BYTES=4611686018427387904
