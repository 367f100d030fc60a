#!/bin/bash
# Session 70: the split top-k with atomic row totals (no P^2 slice sums) -- GPU tests, one program against split
# per rows x N (B up to 64), 8 Flash layers' decode at ctx 65536 with the split off / on.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 200 tests/gpu/test_topk.py
timeout 150 python3 bench/bench_topk_split.py --rows 1,8,16,32,64 --n 2048,4096,8192,16384,65536,262144
for flag in "dsv4.kernels.topk.SPLIT_MIN_N=1073741824" "dsv4.kernels.topk.SPLIT_MIN_N=4096"; do
  echo "== $flag"
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522 timeout 170 \
    python3 bench/flags.py "$flag" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8 \
    --ctx 65536 --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=.*decode |rror" | head -6
done
