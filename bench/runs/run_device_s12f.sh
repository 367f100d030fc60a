#!/bin/bash
# Session 12: the bf16 wo_a copy kernel's test after its fix, the end-to-end GPU tests on the new defaults
# (cuBLAS prefill linears, side stream, one-launch prefill glue, 32-row fused mHC mix), the 8K prefill + graph decode.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 60 tests/gpu/test_grouped_w8a16.py -k dequant
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1,8 --ctx 8192 --kv-dtype fp8 \
    --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|B=|Error"
run 200 tests/gpu/test_model_gpu.py
