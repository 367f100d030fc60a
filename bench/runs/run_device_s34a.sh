#!/bin/bash
# Prepared in session 33 for session 34, one H200 (≈ 2 min): the two decode-MoE tests session 33 changed after its
# last device call -- test_pairs_per_program_same_bits now pins the byte loads for its bit comparison, and
# test_moe_gemv_words allows at most 0.1 % one-ulp flips between words and bytes -- then the whole test_moe files
# on the SCALE_WORDS_MIN_PAIRS = 2 default.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 150 tests/gpu/test_moe_gemv_mma.py tests/gpu/test_moe_gemv_words.py
run 200 tests/gpu/test_moe.py
