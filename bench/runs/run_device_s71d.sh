#!/bin/bash
# Session 71: the FP8 prefill scores' GPU tests and sweeps (with the sampled
# top-k beside the default), then one eager decode step of 4 layers by kernel at ctx 262144 and the 8-layer decode
# there with the split top-k off / on.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 200 tests/gpu/test_indexer_scores.py
for prefix in 0 57344 122880 253952; do
  timeout 100 python3 bench/sweep_index_scores.py --fp4 --prefix $prefix --shapes --sampled 2>&1 | tail -12
done
echo "== profile ctx 262144"
TOP=16 timeout 120 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 262144 2>&1 | grep -vE "^ +[A-Z][a-zA-Z]+\.|part \(" | tail -18
for flag in "dsv4.kernels.topk.SPLIT_MIN_N=1073741824" "dsv4.kernels.topk.SPLIT_MIN_N=4096"; do
  echo "== $flag"
  rows8_at 100 262144 1 "$flag"
done
