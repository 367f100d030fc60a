#!/bin/bash
# Session 14: PDL extended (the router's weight tile and the bf16 decode projections' L2 prefetch before the
# wait), the transposed prefill mHC mix by default -- their GPU tests, then 8 Flash layers with the new defaults.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 150 tests/gpu/test_pdl.py
run 200 tests/gpu/test_mhc.py tests/gpu/test_projections.py tests/gpu/test_router.py
B="bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8,64 --ctx 4096 --kv-dtype fp8 --prefill 8192 --cuda-graphs"
timeout 120 python3 $B 2>&1 | grep -E "ceilings|prefill|B=|Error"
