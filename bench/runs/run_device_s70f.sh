#!/bin/bash
# Session 70 (prepared, not run): the sampled one-program top-k (`topk.SAMPLED`, opt-in) -- its GPU tests, then its
# time against the default on a prompt chunk's rows after 56K and 248K tokens of prefix (picks must be equal).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 200 tests/gpu/test_topk.py
for prefix in 57344 253952; do
  timeout 150 python3 bench/sweep_index_scores.py --prefix $prefix --shapes --sampled 2>&1 | tail -6
done
