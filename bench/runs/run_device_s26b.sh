#!/bin/bash
# Session 26, one H200: 256-token tiles for the prefill MoE (two warpgroups side by side along the tokens share each
# widened weight tile in shared memory, so a weight tile is widened once per 256 tokens instead of once per 128;
# the widening, not the MMAs, bounds the Gluon kernel). Tests first (bit-identical to the 128-row tiles), then the
# whole MoE call per variant, each GEMM alone, and 8-layer 8K prefills with and without.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py -k "token_split or 256-8-True"
T256=dsv4.kernels.moe_config.WIDE256_MIN_PAIRS_PER_EXPERT=1
timeout 150 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "tok256:$T256" \
  "tok256 st3:$T256,dsv4.kernels.moe_wide.TOKEN_SPLIT_STAGES=3" 2>&1 | tail -8
timeout 90 python3 bench/bench_moe_wide_shapes.py --ms 8192 --bm 128 --shapes 64,4,reg,4 128,8,smem,4 2>&1 | tail -3
timeout 90 python3 bench/bench_moe_wide_shapes.py --ms 8192 --bm 256 --shapes 64,8,smem,4,2 64,8,smem,3,2 \
  128,8,smem,3,2 128,8,smem,4,2 2>&1 | tail -5
prefill8() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29526 timeout $1 \
    python3 bench/flags.py "${@:2}" -- bench/bench_parallel.py --world 1 --layers 8 --reps 4 --batches 1 --ctx 4096 \
    --kv-dtype fp8 --prefill 8192 --cuda-graphs 2>&1 | grep -E "prefill|rror" | head -3
}
echo "== prefill, default"; prefill8 120
echo "== prefill, 256-token tiles"; prefill8 120 $T256
