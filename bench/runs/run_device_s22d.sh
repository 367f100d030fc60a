#!/bin/bash
# Measured in session 22 (docs/benchmarks.md "Session 22"): the deferred sum lost at every M > 1; the variant was removed.
# Session 22, one H200: the GEMV's deferred K sum (fp8_gemv.DEFERRED, scales folded into the activation) for the
# 2-4 row linears of a speculative verify step: GPU tests, then the Flash linears at M = 1..4 (GEMM, GEMV, deferred).
source bench/runs/lib.sh
run 240 tests/gpu/test_fp8_gemv.py
timeout 300 python3 bench/sweep_gemv.py --models flash --rows 1,2,3,4 --skip-grid --out $OUT > $OUT/sweep_rows.txt 2>&1
grep -E "M=|copy|rror" $OUT/sweep_rows.txt
