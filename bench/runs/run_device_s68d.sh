#!/bin/bash
# Session 68 (≈ 5 min). The prefill scores' launch shape once relu(bf16(s)) is one packed conversion per pair (s68c:
# 64 x 128 x 4 x 3 1.08x the default 128 x 128 x 8 x 3 at 56K, 64 x 256 x 8 x 4 1.07x at 248K): the candidates at both
# prefixes, then an 8K chunk after 56K tokens through 4 Flash layers (eager, kernels by GPU time) with the default and
# with the sweep's 64 x 128 x 4 x 3 (`indexer_scores.PREFILL_SHAPE`).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 57344 253952; do
  timeout 120 python3 bench/sweep_index_scores.py --prefix $p --shapes 64,128,4,3 64,128,4,4 64,256,8,3 64,256,8,4 \
    64,256,4,3 2>&1 | grep -v -i warn | grep -v "^top-\|^4096, 8"
done
for shape in "(128,128,8,3)" "(64,128,4,3)"; do
  TOP=10 timeout 150 python3 bench/flags.py "dsv4.kernels.indexer_scores.PREFILL_SHAPE=$shape" -- \
    bench/profile_step.py --layers 4 --prefill 8192 --prefix 57344 > $OUT/chunk_${shape//[^0-9]/_}.txt 2>&1
  echo "PREFILL_SHAPE $shape"
  grep -E "chunk after|kernels,|^layer|^forward|^ +[0-9]+ +[0-9]+ |rror" $OUT/chunk_${shape//[^0-9]/_}.txt | grep -v -i warn | head -20
done
