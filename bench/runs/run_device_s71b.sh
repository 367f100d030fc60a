#!/bin/bash
# Session 71: session 70's prepared s70f (the sampled top-k's GPU tests and its time after 56K / 248K tokens of
# prefix), then whether the indexer's dots sum alike on the FP8 and bf16 tensor cores (bench/check_fp8_index_dots.py).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 bench/check_fp8_index_dots.py 2>&1 | tail -5
run 200 tests/gpu/test_topk.py
for prefix in 57344 253952; do
  timeout 150 python3 bench/sweep_index_scores.py --prefix $prefix --shapes --sampled 2>&1 | tail -6
done
