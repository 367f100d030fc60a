#!/bin/bash
# Session 15, one H200, final tree: s15c found the one-launch mHC site slower (now off by default); here the
# GPU tests of the final defaults and an A/B of the two launch fusions left on (inverse RoPE in the decode
# attention kernel; the MoE z requant / combine in the GLU / down kernels), 8 Flash layers, B = 1 / 8.
source bench/runs/lib.sh
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
B="bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill 0 --cuda-graphs"
M=dsv4.kernels.moe_gemv
ab() {  # name, flags...
  echo "== $1"; timeout 65 python3 bench/flags.py "${@:2}" -- $B 2>&1 | grep -E "B=|Error|rror" | head -4
}
ab default dsv4.kernels.mhc.FUSED_MAX_T=0
ab rope-off dsv4.model.attention.KERNEL_INVERSE_ROPE=False
ab moe-off $M.FUSE_Z_QUANT=False $M.FUSE_COMBINE=False
run 50 tests/gpu/test_attention.py
run 170 tests/gpu/test_model_gpu.py
run 110 tests/gpu/test_pdl.py
