#!/bin/bash
# Session 70: 8 Flash layers' decode at ctx 262144 (B = 1), the split top-k off / on.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for flag in "dsv4.kernels.topk.SPLIT_MIN_N=1073741824" "dsv4.kernels.topk.SPLIT_MIN_N=4096"; do
  echo "== $flag"
  rows8_at 150 262144 1 "$flag"
done
