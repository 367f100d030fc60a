#!/bin/bash
# Prepared in session 24 (its device time was spent), one H200:
# 1. the GPU tests session 24's last call cut by their time limits (the final GEMV picks: session 17's shapes + the
#    bytes-in-flight rule that sends Pro's K = 7168 linears to the tensor-core GEMM);
# 2. Pro-shaped rows on one GPU, first 4 layers (HCA, HCA, CSA, HCA; ≈ 70 GB), decode B = 1 / 8 at ctx 4096, paged
#    FP8, graphs, with the in-flight rule (default) and without it (GEMV_MIN_INFLIGHT = 0: the GEMV as before) in
#    alternating order; a prefill of 8K once. No Pro rows on one GPU exist yet (session 1 ran 8 on two, eager).
source bench/runs/lib.sh
run 200 tests/gpu/test_fp8_gemv.py tests/gpu/test_fused_fp8_linears_gpu.py
run 240 tests/gpu/test_model_gpu.py
pro() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29528 timeout $1 \
    python3 bench/flags.py "${@:3}" -- bench/bench_parallel.py --config bench/configs/deepseek-v4-pro.config.json \
    --world 1 --layers 4 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill $2 --cuda-graphs 2>&1 \
    | grep -E "ceilings|B=|prefill|rror|memory" | head -8
}
F=dsv4.kernels.linear_config.GEMV_MIN_INFLIGHT
for v in 4194304 0 4194304 0; do echo "Pro, $F=$v"; pro 150 0 $F=$v; done
echo "Pro, prefill 8K"; pro 150 8192 $F=4194304
