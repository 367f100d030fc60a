#!/bin/bash
# Session 67 (≈ 5 min with the start). (1) Long prompts: an 8K-token chunk after 0 and after 56K tokens of the same
# prompt, 4 Flash layers (SWA, SWA, CSA, HCA), eager prefill: wall, per-layer spans, kernels by GPU time. No chunk
# after a long prefix was measured before; the CSA indexer scores every compressed entry of the prefix.
# (2) The early MTP catch-up with two drafts (chained MTP rows in propose), B = 1, alternating with the late one.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 0 57344; do
  TOP=14 timeout 170 python3 bench/profile_step.py --layers 4 --prefill 8192 --prefix $p > $OUT/chunk_$p.txt 2>&1
  grep -E "chunk after|kernels,|^layer|^forward|^ +[0-9]+ +[0-9]+ |rror" $OUT/chunk_$p.txt | grep -v -i warn | head -26
done
timeout 150 python3 bench/bench_engine_step.py --batches 1 --speculative 2 --drafts early --overlap off --steps 24 \
  --repeat 2 > $OUT/s67d_k2.txt 2>&1
grep -E "ceilings|^B \||^[0-9]+ \||rror" $OUT/s67d_k2.txt | tail -8
