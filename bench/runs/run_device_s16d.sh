#!/bin/bash
# Session 16, one H200 (two-GPU machines not lent): MTP speculation on the GPU after the `decide` refactor (graphed
# draft/verify vs eager, new test), then the 8-layer Flash decode/prefill rows on the current tree.
source bench/runs/lib.sh
run 230 tests/gpu/test_model_gpu.py -k "speculative or llm_with_cuda_graphs"
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522 timeout 200 \
  python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 \
  --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|B=|rror" | head -12
