#!/bin/bash
# Session 20, one H200 (the last ~4 device minutes): what an engine that schedules one step ahead would gain --
# 8 Flash layers, decode steps fed their own picks, the host's read-back before vs after the next launch
# (bench_parallel's chained decode), B = 1 / 8 / 64.
export PYTHONUNBUFFERED=1
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29524 timeout 185 \
  python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8,64 --ctx 4096 --kv-dtype fp8 \
  --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -10
