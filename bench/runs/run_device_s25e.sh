#!/bin/bash
# Session 25, one H200, last call: the cuBLAS path moved to dsv4/kernels/fp8_cublas.py (test_fp8_linear), top-k at
# Pro's index_topk 1024 (test_topk), the attention kernels (their output's inverse RoPE is norm_rope's), then
# Pro-shaped rows (4 layers: HCA, HCA, CSA, HCA) at B = 64 and at 64K context, and a second alternating round of
# the in-flight rule at B = 8 (s25c: 3.55 with it, 3.68 without).
source bench/runs/lib.sh
run 150 tests/gpu/test_fp8_linear.py tests/gpu/test_topk.py
run 90 tests/gpu/test_attention.py
pro() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29528 timeout $1 \
    python3 bench/flags.py "${@:4}" -- bench/bench_parallel.py --config bench/configs/deepseek-v4-pro.config.json \
    --world 1 --layers 4 --reps 4 --batches $2 --ctx $3 --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 \
    | grep -E "ceilings|B=.*decode |rror|memory" | head -6
}
F=dsv4.kernels.linear_config.GEMV_MIN_INFLIGHT
echo "Pro, B = 64 at 4K"; pro 90 64 4096 $F=4194304
echo "Pro, B = 1 / 8 at 64K"; pro 110 1,8 65536 $F=4194304
for v in 0 4194304; do echo "Pro, B = 8 at 4K, $F=$v"; pro 55 8 4096 $F=$v; done
