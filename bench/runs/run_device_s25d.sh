#!/bin/bash
# Session 25, one H200: Flash-Base (FP8 experts, float32 block scales) as a whole model in kernel mode with
# graphs, which no run had done (its MoE kernels were benchmarked alone): 8 layers, decode B = 1 / 8 / 64 at
# ctx 4096 and a prefill of 8K, beside Flash's rows of the same call; then the rest of the end-to-end GPU
# tests after the norm_rope change (the Pro-shaped ones passed in s25c).
source bench/runs/lib.sh
rows() {
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29529 timeout $1 \
    python3 bench/bench_parallel.py --config bench/configs/$2.config.json --world 1 --layers 8 --reps 4 \
    --batches 1,8,64 --ctx 4096 --kv-dtype fp8 --prefill 8192 --cuda-graphs 2>&1 \
    | grep -E "ceilings|B=.*decode |prefill|rror|memory" | head -8
}
for c in deepseek-v4-flash-base deepseek-v4-flash; do echo "== $c"; rows 150 $c; done
run 200 tests/gpu/test_model_gpu.py -k "not pro"
