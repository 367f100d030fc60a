#!/bin/bash
# Session 58: the page-copy kernel (dsv4/kernels/page_copy.py) -- its GPU tests, the pools' copy through it, the
# engine's GPU tests that copy caches (forks, snapshots, retained turns), bench_copy_pages at 43 layers -- and the
# thinking-turns diagnostic. Carry [".whl"].
source bench/runs/lib.sh
export PYTHONPATH=$PWD
timeout 120 python3 bench/bench_copy_pages.py --layers 43 --reps 20 2>&1 | tail -3
run 150 tests/gpu/test_page_copy.py
timeout 150 python3 bench/runs/diag_thinking_turns.py 2>&1 | grep -E "thinking=|Error|error" | head -12
run 200 tests/gpu/test_engine_gpu.py -k "not thinking_turns"
# where the host time of an 8-layer B = 1 decode step goes (graph replay 1.03 ms of a 2.1 ms step, s58a)
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29534 timeout 200 \
  python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 --kv-dtype fp8 --prefill 0 \
  --cuda-graphs --host-profile 50 2>&1 | grep -vE "^\s*$|Ordered by|List reduced" | tail -26
