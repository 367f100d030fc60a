#!/bin/bash
# Session 68 (≈ 4 min). The radix top-k's select pass with one scan instead of two (offline SASS: 2,106 -> 1,639
# instructions per 4,096-key chunk): the sweep's top-k row at 56K and 248K of prefix with this tree's topk.py, then
# with the one before (bench/runs/topk_before_s68.py, swapped in), alternating; the top-k and indexer GPU tests.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
cp dsv4/kernels/topk.py /tmp/topk_new.py
for round in 1 2; do
  for which in new before; do
    [ $which = new ] && cp /tmp/topk_new.py dsv4/kernels/topk.py || cp bench/runs/topk_before_s68.py dsv4/kernels/topk.py
    for p in 57344 253952; do
      echo "round $round, topk $which, prefix $p: $(timeout 100 python3 bench/sweep_index_scores.py --prefix $p \
        --shapes 2>&1 | grep -A1 "^top-" | tail -1)"
    done
  done
done
cp /tmp/topk_new.py dsv4/kernels/topk.py
run 200 tests/gpu/test_topk.py tests/gpu/test_indexer_scores.py
