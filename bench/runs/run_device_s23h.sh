#!/bin/bash
# Session 23, one H200: 24 Flash layers at B = 1 with the new prefetch default (session 20: replay 4.04 ms), for the
# 43-layer extrapolation.
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29523 timeout 250 \
  python3 bench/bench_parallel.py --world 1 --layers 24 --reps 4 --batches 1 --ctx 4096 --kv-dtype fp8 \
  --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|model:|B=|rror" | head -8
