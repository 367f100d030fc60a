#!/bin/bash
# Session 13: the new decode-size linear launch shapes (tests + the #5 table against cuBLAS), and the L2
# prefetch probe.
source bench/runs/lib.sh
timeout 120 python3 bench/probe_l2_prefetch.py --copies 8 --busy-us 20 2>&1 | tail -12
timeout 60 python3 bench/probe_l2_prefetch.py --copies 8 --busy-us 8 2>&1 | tail -7
run 200 tests/gpu/test_fp8_linear.py tests/gpu/test_fused_fp8_linears_gpu.py tests/gpu/test_grouped_w8a16.py
timeout 150 python3 bench/bench_gemm_moe.py --only linear --models flash --ms 1,8,64,128 --no-sweep \
    --out $OUT > $OUT/gemm.txt 2>&1; grep -E "^ceilings|^flash " $OUT/gemm.txt | head -40
