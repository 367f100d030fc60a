#!/bin/bash
# Session 16 (prepared, not run), nvidia-h200-x2, after run_device_s16e_x2.sh: full Flash on two GPUs with
# graphs, the fast all-reduce vs NCCL only, in the same call (the ceilings line also times one fp32 row of each
# inside a CUDA graph).
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
for F in 1 0; do
  echo "DSV4_FAST_ALLREDUCE=$F"
  DSV4_FAST_ALLREDUCE=$F timeout 250 python3 bench/bench_parallel.py --world 2 --reps 4 --batches 1,8 --ctx 4096 \
    --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -12
done
