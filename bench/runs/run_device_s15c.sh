#!/bin/bash
# Session 15, one H200: GPU tests of the decode fusions (mHC one launch per site at B = 1, inverse RoPE in the
# decode attention kernel, the MoE's z requant / combine / x quant folded into the GLU / down kernels), then an
# A/B of each in the 8-layer Flash step (B = 1 / 8, ctx 4096, graph replay), all in one call.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
run 120 tests/gpu/test_mhc.py tests/gpu/test_attention.py
run 100 tests/gpu/test_moe_gemv_mma.py tests/gpu/test_moe_gemv_fused.py tests/gpu/test_moe.py
B="bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill 0 --cuda-graphs"
M=dsv4.kernels.moe_gemv
ab() {  # name, flags...
  echo "== $1"; timeout 70 python3 bench/flags.py "${@:2}" -- $B 2>&1 | grep -E "B=|Error|rror" | head -4
}
ab all-off dsv4.kernels.mhc.FUSED_MAX_T=0 dsv4.model.attention.KERNEL_INVERSE_ROPE=False $M.FUSE_Z_QUANT=False \
  $M.FUSE_COMBINE=False
ab default dsv4.kernels.mhc.FUSED_MAX_T=1
ab mhc-fused-to-8 dsv4.kernels.mhc.FUSED_MAX_T=8
ab moe-off $M.FUSE_Z_QUANT=False $M.FUSE_COMBINE=False
ab x-quant-too $M.FUSE_X_QUANT=True
