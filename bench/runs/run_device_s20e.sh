#!/bin/bash
# Session 20, one H200 (last call): the model-level GPU tests on the final tree (the greedy pick is now
# first_argmax), then 24 Flash layers at B = 1 / 8 (graph replay), to extrapolate to 43 layers from the
# per-layer slope between 8 and 24 layers instead of scaling the 8-layer step (whose fixed costs -- embedding,
# slot derivation, the final mHC head -- the old formula multiplied by 43/8).
source bench/runs/lib.sh
run 220 tests/gpu/test_model_gpu.py
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29523 timeout 240 \
  python3 bench/bench_parallel.py --world 1 --layers 24 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 \
  --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|model:|B=|rror" | head -8
