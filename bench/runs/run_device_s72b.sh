#!/bin/bash
# Session 72: each term of the fold's flag on the GPU (bench/runs/diag_fold2.py), then the sampled top-k with its
# grouped scan and fitted chunks below 32K entries (N = 8K, 16K: SAMPLED_MIN_N lowered).
source bench/runs/lib.sh
timeout 90 python3 bench/runs/diag_fold2.py 2>&1 | tail -30
for prefix in 24576 57344; do
  timeout 100 python3 bench/flags.py dsv4.kernels.topk.SAMPLED_MIN_N=4096 -- bench/sweep_index_scores.py --sampled \
    --prefix $prefix --shapes 2>&1 | grep -E "top-|SAMPLED|^default \|"
done
