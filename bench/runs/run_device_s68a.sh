#!/bin/bash
# Prepared in session 67 (≈ 4-5 min with the start). The CSA indexer's prefill scores after a long prefix: s67d
# measured 4.56 ms of an 18.7 ms CSA layer for an 8K chunk after 56K tokens (H100), at the only launch shape the
# kernel has run (64 queries x 128 keys, 4 warps). Its q tile is read from L2 once per head and key tile, so wider
# key tiles halve that traffic. Sweep the shapes at 56K and 248K of prefix (the top-k of the same scores for scale).
# A shape that wins at both and keeps the outputs equal becomes `prefill_index_scores`'s default (then run
# tests/gpu/test_indexer_scores.py and `profile_step.py --layers 4 --prefill 8192 --prefix 57344` again).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 bench/sweep_index_scores.py --prefix 57344 --topk 2>&1 | grep -v -i warn | tail -50
timeout 120 python3 bench/sweep_index_scores.py --prefix 253952 --shapes 64,128,4,3 64,256,8,3 128,256,8,3 \
  128,128,8,3 64,256,8,2 2>&1 | grep -v -i warn | tail -9
