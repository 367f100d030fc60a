#!/bin/bash
# Prepared in session 24 (its device time was spent), one H200:
# 1. the GPU tests session 24's last call cut by their time limits (the final GEMV picks: session 17's shapes + the
#    bytes-in-flight rule that sends Pro's K = 7168 linears to the tensor-core GEMM);
# 2. Pro-shaped rows on one GPU, first 4 layers (HCA, HCA, CSA, HCA; ≈ 70 GB), decode B = 1 / 8 at ctx 4096, paged
#    FP8, graphs, with the in-flight rule (default) and without it (GEMV_MIN_INFLIGHT = 0: the GEMV as before) in
#    alternating order; a prefill of 8K once. No Pro rows on one GPU exist yet (session 1 ran 8 on two, eager).
source bench/runs/lib.sh
run 200 tests/gpu/test_fp8_gemv.py tests/gpu/test_fused_fp8_linears_gpu.py
run 240 tests/gpu/test_model_gpu.py
F=dsv4.kernels.linear_config.GEMV_MIN_INFLIGHT
for v in 4194304 0 4194304 0; do echo "Pro, $F=$v"; pro 150 1,8 4096 0 $F=$v; done
echo "Pro, prefill 8K"; pro 150 1,8 4096 8192 $F=4194304
