#!/bin/bash
# Session 70: 8 Flash layers' decode at ctx 262144 (B = 1), the split top-k off / on.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
for flag in "dsv4.kernels.topk.SPLIT_MIN_N=1073741824" "dsv4.kernels.topk.SPLIT_MIN_N=4096"; do
  echo "== $flag"
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522 timeout 150 \
    python3 bench/flags.py "$flag" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 \
    --ctx 262144 --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=.*decode |rror|memory" | head -4
done
