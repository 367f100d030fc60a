#!/bin/bash
# Session 26, one H200 (the command given inline to the device tool, kept here): 8 Flash layers, 8K prefill, mixed
# tiles (the default from 128 pairs per expert) and 128-row tiles alternating, twice each.
source bench/runs/lib.sh
OFF=dsv4.kernels.moe_config.MIXED_MIN_PAIRS_PER_EXPERT=1073741824
p8() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout $1 \
    python3 bench/flags.py "${@:2}" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 \
    --kv-dtype fp8 --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|rror" | head -3
}
for round in 1 2; do
  echo "== mixed (default)"; p8 100
  echo "== 128-row tiles"; p8 100 $OFF
done
