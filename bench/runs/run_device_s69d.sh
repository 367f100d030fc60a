#!/bin/bash
# (The code it measured was reverted after this run: its flags are in commits cc95bb4 / c1d91f3.)
# Session 69: the radix top-k given each row's largest key (one histogram below it instead of two radix passes),
# against the default, after 56K and 248K tokens; then the top-k GPU tests.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 57344 253952; do
  timeout 150 python3 bench/sweep_index_scores.py --prefix $p --shapes --window 2>&1 | grep -v -i warn | grep -A3 "^top-"
done
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_topk.py 2>&1 | tail -3
