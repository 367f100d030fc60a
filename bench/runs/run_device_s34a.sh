#!/bin/bash
# Prepared in session 33 for session 34, one H200 (≈ 6 min): the two decode-MoE tests session 33 changed after its
# last device call -- test_pairs_per_program_same_bits now pins the byte loads for its bit comparison, and
# test_moe_gemv_words allows at most 0.1 % one-ulp flips between words and bytes -- then the whole test_moe files
# on the SCALE_WORDS_MIN_PAIRS = 2 default; then the decode MoE in CUDA graphs with fused_moe's launches (pairs per
# program included, as sweep_moe_gemv.py --default-only now does), bytes / words: M = 4 (one pair, no split: words
# untimed there) and M = 8, 16 (blocks of two pairs).
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 150 tests/gpu/test_moe_gemv_mma.py tests/gpu/test_moe_gemv_words.py
run 200 tests/gpu/test_moe.py
M=dsv4.kernels.moe_gemv.SCALE_WORDS_MIN_PAIRS
G=dsv4.kernels.moe_gemv.SCALE_WORDS
for T in 4 8 16; do
  for V in "$G=False" "$M=1" "$G=False" "$M=1"; do
    echo "tokens $T $V"
    timeout 60 python3 bench/flags.py "$V" -- bench/sweep_moe_gemv.py --tokens $T --default-only 2>&1 | tail -1
  done
done
