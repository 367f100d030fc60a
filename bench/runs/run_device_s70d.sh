#!/bin/bash
# Session 70: the split top-k with atomic row totals (no P^2 slice sums) -- GPU tests, one program against split
# per rows x N (B up to 64), 8 Flash layers' decode at ctx 65536 with the split off / on.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 200 tests/gpu/test_topk.py
timeout 150 python3 bench/bench_topk_split.py --rows 1,8,16,32,64 --n 2048,4096,8192,16384,65536,262144
for flag in "dsv4.kernels.topk.SPLIT_MIN_N=1073741824" "dsv4.kernels.topk.SPLIT_MIN_N=4096"; do
  echo "== $flag"
  rows8_at 170 65536 1,8 "$flag"
done
