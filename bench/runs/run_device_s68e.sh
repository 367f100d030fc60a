#!/bin/bash
# Session 68 (≈ 4 min). The indexer's prefill scores in Gluon (then `indexer_scores.PREFILL_GLUON`, opt-in: 64 queries x 256
# keys on 8 warps, the next head's wgmma in flight while a head is rounded and weighted) against the Triton default,
# at 56K and 248K of prefix; its GPU test (scores equal to the Triton kernel's); an 8K chunk after 56K tokens through
# 4 Flash layers with it.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 57344 253952; do
  timeout 120 python3 bench/sweep_index_scores.py --prefix $p --shapes 2>&1 | grep -v -i warn | grep -v "^4096, 8"
done
run 120 tests/gpu/test_indexer_scores.py
TOP=8 timeout 150 python3 bench/flags.py "dsv4.kernels.indexer_scores.PREFILL_GLUON=True" -- \
  bench/profile_step.py --layers 4 --prefill 8192 --prefix 57344 > $OUT/chunk_gluon.txt 2>&1
grep -E "chunk after|kernels,|^layer|^forward|^ +[0-9]+ +[0-9]+ |rror" $OUT/chunk_gluon.txt | grep -v -i warn | head -18
