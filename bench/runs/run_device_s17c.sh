#!/bin/bash
# Session 17, one H200: the GEMV's picks from s17b's sweep and its float32-scale W8A16 rounding: kernel tests,
# then the 8-layer decode rows with the GEMV off and on in the same call.
source bench/runs/lib.sh
run 130 tests/gpu/test_grouped_w8a16.py tests/gpu/test_fp8_gemv.py tests/gpu/test_fused_fp8_linears_gpu.py
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29522
for flag in False True; do
  echo "GEMV=$flag"
  timeout 95 python3 bench/flags.py dsv4.kernels.linear_config.GEMV=$flag -- bench/bench_parallel.py --world 1 \
    --layers 8 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 \
    | grep -E "ceilings|B=|rror" | head -6
done
