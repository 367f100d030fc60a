#!/bin/bash
# Prepared in session 10 for session 11's first call: the Gluon MoE with one warpgroup per program
# (moe_wide.ASYNC_ONE_WARPGROUP: 64 weight rows, 4 warps, two programs per SM; z quantised afterwards by
# requant_rows) -- its tests, the per-GEMM launch-shape table, the whole MoE call against the default, and
# 8 Flash layers' 8K prefill with it on (in-process override) and off.
source "$(dirname "$0")/lib.sh"
run 150 tests/gpu/test_moe_wide.py
timeout 150 python3 bench/bench_moe_wide_shapes.py --ms 4096,8192
timeout 60 python3 bench/bench_moe_wide_shapes.py --ms 2048 --bm 64 --shapes 128,8,reg,4 64,4,reg,4 64,4,reg,3
timeout 120 python3 bench/bench_moe_flags.py --ms 2048,4096,8192 "default:" \
    "one warpgroup:dsv4.kernels.moe_wide.ASYNC_ONE_WARPGROUP=True"
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518
for one in True False; do
echo "--- 8K prefill of 8 Flash layers, ASYNC_ONE_WARPGROUP = $one"
timeout 100 python3 bench/flags.py dsv4.kernels.moe_wide.ASYNC_ONE_WARPGROUP=$one -- bench/bench_parallel.py --world 1 \
    --layers 8 --reps 2 --batches 1 --kv-dtype fp8 --prefill 8192 2>&1 | grep -E "prefill|copy"
done
