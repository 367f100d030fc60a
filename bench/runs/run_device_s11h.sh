#!/bin/bash
# Session 11, last call: the final defaults' 8K prefill and decode through CUDA graphs at ctx 8192 (s11g showed
# that the slow "decode at ctx 8192" of s11a-s11c was the eager step, host-bound at any context).
export PYTHONUNBUFFERED=1 RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
timeout 200 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8 --ctx 8192 --kv-dtype fp8 \
    --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|B="
