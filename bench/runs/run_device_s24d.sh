#!/bin/bash
# Session 24, one H200: which half of the session-24 GEMV picks cost the model 0.02-0.03 ms per 8-layer B = 1 replay in
# s24c (isolated, both were faster): the 32-row shapes (GEMV_PICKS 24 vs 17) x wo_b on the GEMV (GEMV_LONG_K_BLOCKS
# 64) or on the tensor-core GEMM (2^30), twice in alternating order.
source bench/runs/lib.sh
L=dsv4.kernels.linear_config
for r in 1 2; do
  for v in "17 1073741824" "17 64" "24 1073741824" "24 64"; do
    set -- $v; echo "GEMV_PICKS=$1 GEMV_LONG_K_BLOCKS=$2"; rows8 80 1 $L.GEMV_PICKS=$1 $L.GEMV_LONG_K_BLOCKS=$2 | grep "B=  1 ctx=4096: decode"
  done
done
