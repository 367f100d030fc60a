#!/bin/bash
# Prepared in session 21 (not run: two-GPU machines were not lent), nvidia-h200-x2: the sharded graph test, now also
# covering the engine's look-ahead across ranks (rank 0's ids broadcast over NCCL; with vs without), the
# symmetric-memory all-reduce test, then full Flash on two GPUs with graphs and the fast path.
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
run 300 tests/gpu/test_parallel_graphs.py tests/gpu/test_fast_allreduce.py
DSV4_FAST_ALLREDUCE=1 timeout 170 python3 bench/bench_parallel.py --world 2 --reps 4 --batches 1,8 --ctx 4096 \
  --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -12
