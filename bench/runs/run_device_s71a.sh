#!/bin/bash
# Session 71: what of a decode step still grows with the context. 8 Flash layers' decode at ctx 262144 (B = 1), the
# split top-k off / on (session 70's prepared s70e), then one eager decode step of 4 layers by kernel at ctx 4096
# and 262144.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for flag in "dsv4.kernels.topk.SPLIT_MIN_N=1073741824" "dsv4.kernels.topk.SPLIT_MIN_N=4096"; do
  echo "== $flag"
  rows8_at 150 262144 1 "$flag"
done
for ctx in 4096 262144; do
  echo "== profile ctx $ctx"
  TOP=22 timeout 140 python3 bench/profile_step.py --layers 4 --batch 1 --ctx $ctx 2>&1 | grep -vE "^ +[A-Z][a-zA-Z]+\.|part \(" | tail -26
done
