#!/bin/bash
# Prepared in session 23 (no device time left), one H200:
# 1. issue #6 item 5's peer in the same call as dsv4's rows: the transformers port's eager model at Flash width,
#    4 layers (sliding, sliding, CSA, HCA), bf16 random, decode at B = 1 after a 4096-token prompt, an 8K prefill;
#    then dsv4's 8-layer rows (decode B = 1, prefill 8K);
# 2. the grid barrier as one asm statement (so loops around it still get software-pipelined): its GPU test, then the
#    chain rows with the new "dot" variant (tensor-core chain whose weights Triton streams through shared memory
#    across the barriers; offline it compiles with 3-4 async-copy stages). Last, since a hang would eat its limit.
source bench/runs/lib.sh
timeout 240 python3 bench/bench_peer_transformers.py --layers 4 --ctx 4096 --batches 1 --prefill 8192 --reps 5 2>&1 \
  | grep -E "^peer|rror" | head -8
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29524 timeout 200 \
  python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 --kv-dtype fp8 \
  --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|B=|prefill|rror" | head -8
run 120 tests/gpu/test_grid_barrier.py
timeout 150 python3 bench/bench_grid_barrier.py --dims 1024,2048,4096 --stages 8 --per-sm 4 2>&1 | tee $OUT/chain.txt \
  | grep -vE "^\s*$" | tail -12
