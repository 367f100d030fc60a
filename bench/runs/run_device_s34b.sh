#!/bin/bash
# Prepared in session 33 for session 34, one H200 (≈ 5 min), after s34a. SCALE_WORDS cut the decode GLU's registers
# 154 -> 96 (offline SASS), yet M = 1 (one pair per program, split K 2) got 12 % slower with it (s33e). Does another
# launch shape win with the words at M = 1? The tensor-core shapes swept with the words on for every launch
# (SCALE_WORDS_MIN_PAIRS = 1) against the bytes' default; then the same sweep on the bytes for comparison.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
M=dsv4.kernels.moe_gemv.SCALE_WORDS_MIN_PAIRS
timeout 280 python3 bench/flags.py "$M=1" -- bench/sweep_moe_gemv.py --tokens 1 --mma --dot-blocks 1 2>&1 | tail -34
timeout 200 python3 bench/sweep_moe_gemv.py --tokens 1 --mma --dot-blocks 1 2>&1 | tail -3
