#!/bin/bash
# Prepared in session 10 for session 11: the prefill MoE on FP8 operands (moe_wide.WIDE_FP8, Gluon,
# dsv4.kernels.moe_wide_fp8: MXFP4 re-encoded to e4m3 per 128-wide block, FP8 wgmma, per-128 promotion;
# 64-token tiles). Its tests, then the MoE call against the default (L2 flushed, side by side), then 8 Flash
# layers' 8K prefill with it on. ptxas (CPU machine): GLU 255 registers with 112 B of spills at 64-token
# tiles, none at 32 (FP8_BM = 32 is the fallback to try if it is slow).
source "$(dirname "$0")/lib.sh"
run 120 tests/gpu/test_moe_wide.py -k "fp8 or async_kernel_matches"
timeout 150 python3 bench/bench_moe_flags.py --ms 2048,4096,8192 "default:" \
    "fp8 bm64:dsv4.kernels.moe_wide.WIDE_FP8=True" \
    "fp8 bm64 s3:dsv4.kernels.moe_wide.WIDE_FP8=True,dsv4.kernels.moe_wide.FP8_STAGES=3" \
    "fp8 bm32:dsv4.kernels.moe_wide.WIDE_FP8=True,dsv4.kernels.moe_wide.FP8_BM=32"
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29519
echo "--- 8K prefill of 8 Flash layers, WIDE_FP8 = True"
timeout 100 python3 bench/flags.py dsv4.kernels.moe_wide.WIDE_FP8=True -- bench/bench_parallel.py --world 1 \
    --layers 8 --reps 2 --batches 1 --kv-dtype fp8 --prefill 8192 2>&1 | grep -E "prefill|copy"
