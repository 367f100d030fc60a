#!/bin/bash
# Session 28, one H200 (≈ 2 min): an 8K prompt through 8 Flash layers in one forward vs in the engine's default
# token budget per step (2048: four forwards) and 4096 -- what the default budget costs a long prompt's TTFT.
source bench/runs/lib.sh
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout 240 \
  python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 --kv-dtype fp8 \
  --prefill 8192 --prefill-chunks 8192,2048,4096 --prefill-reps 3 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|rror"
