#!/bin/bash
# Session 17, nvidia-h200-x2, if lent (≈ 400 s of device time left): session 16's s16e without the sharded graph
# test -- the symmetric-memory all-reduce test, then full Flash on two GPUs with graphs and the fast path (the
# ceilings line times NCCL vs the fast path on one fp32 row inside CUDA graphs, same run).
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
run 90 tests/gpu/test_fast_allreduce.py
DSV4_FAST_ALLREDUCE=1 timeout 170 python3 bench/bench_parallel.py --world 2 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill 0 \
  --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -12
