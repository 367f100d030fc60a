#!/bin/bash
# Prepared in session 33 for session 34, one H200 (≈ 6 min): the two decode-MoE tests session 33 changed after its
# last device call -- test_pairs_per_program_same_bits now pins the byte loads for its bit comparison, and
# test_moe_gemv_words allows at most 0.1 % one-ulp flips between words and bytes -- then the whole test_moe files
# on the SCALE_WORDS_MIN_PAIRS = 2 default; then the whole decode MoE call (fused_moe) in CUDA graphs
# (bench_moe_flags.py --graphs, new), bytes / the default / words for every launch, twice: M = 1 and 4 (one pair
# per program; words untimed at 4), 8-64 (blocks of two pairs).
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 150 tests/gpu/test_moe_gemv_mma.py tests/gpu/test_moe_gemv_words.py
run 200 tests/gpu/test_moe.py
M=dsv4.kernels.moe_gemv.SCALE_WORDS_MIN_PAIRS
G=dsv4.kernels.moe_gemv.SCALE_WORDS
timeout 200 python3 bench/bench_moe_flags.py --graphs 16 --ms 1,4,8,16,64 "bytes:$G=False" "default:" \
  "words_all:$M=1" "bytes2:$G=False" "default2:" "words_all2:$M=1" 2>&1 | tail -6
