#!/bin/bash
# Session 14, last call: the model's GPU tests on the final tree (PDL on, transposed prefill mix), the decode
# MoE tests (cut by s14b's time limit), and the GEMMs' L2 prefetch depth 8 K blocks vs the default 4.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 100 tests/gpu/test_pdl.py
run 180 tests/gpu/test_model_gpu.py
run 50 tests/gpu/test_moe_gemv_mma.py
B="bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill 0 --cuda-graphs"
echo "== PREFETCH_KBLOCKS=8"
timeout 75 python3 bench/flags.py dsv4.kernels.fp8_linear.PREFETCH_KBLOCKS=8 -- $B 2>&1 | grep -E "ceilings|B=|Error"
