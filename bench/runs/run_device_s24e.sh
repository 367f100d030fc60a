#!/bin/bash
# Session 24, one H200: #6 item 5's table on the current tree -- 8 Flash layers (paged FP8, graphs), decode at
# B = 1, 8, 64 and context 4K and 64K, prefill 8K, kernel counts and the roofline in the same calls.
source bench/runs/lib.sh
for c in "4096 8192 240" "65536 0 300"; do
  set -- $c
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout $3 \
    python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8,64 --ctx $1 --kv-dtype fp8 \
    --prefill $2 --cuda-graphs --json $OUT/rows_$1.json 2>&1 | grep -E "ceilings|B=|prefill|rror" | head -12
done
