#!/bin/bash
# Session 26, one H200: mixed tiles for the prefill MoE (128-row tiles over pairs of an expert's 64-row blocks, a
# 64-row tile for an odd last block: an expert's padding under 64 rows instead of under 128). s26b showed the Gluon
# GLU is not bound by its widening (256-token tiles, one widening per 256 tokens, timed the same), so the padded
# rows' MMAs are what is left to cut. Tests first (bit-identical to 128-row tiles; the unlisted path unchanged),
# then the MoE call, then 8-layer 8K prefills.
source bench/runs/lib.sh
run 240 tests/gpu/test_moe_wide.py -k "mixed or async_kernel_matches or test_fused_moe_wide"
MIX=dsv4.kernels.moe_wide.MIXED_TILES=True
timeout 150 python3 bench/bench_moe_flags.py --ms 2048,4096,8192,16384 "default:" "mixed:$MIX" \
  "mixed from 40:$MIX,dsv4.kernels.moe_config.WIDE_MIN_PAIRS_PER_EXPERT=40" 2>&1 | tail -6
prefill8() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout $1 \
    python3 bench/flags.py "${@:2}" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 \
    --kv-dtype fp8 --prefill 8192 --cuda-graphs 2>&1 | grep -E "prefill|rror" | head -3
}
echo "== prefill, mixed tiles"; prefill8 110 $MIX
echo "== prefill, default"; prefill8 110
echo "== prefill, mixed tiles"; prefill8 110 $MIX
