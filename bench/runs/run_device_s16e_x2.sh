#!/bin/bash
# Session 16, nvidia-h200-x2, the one call the remaining budget allows (s16b + half of s16c): the symmetric-memory
# all-reduce test, full Flash on two GPUs with graphs and the fast path (its ceilings line times NCCL vs the fast
# path on one fp32 row inside CUDA graphs, same run), then the sharded graph test with phase stamps / hang stacks.
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
run 100 tests/gpu/test_fast_allreduce.py
DSV4_FAST_ALLREDUCE=1 timeout 170 python3 bench/bench_parallel.py --world 2 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill 0 \
  --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -12
DSV4_TEST_HANG_S=285 timeout 300 python3 -m pytest -x -s -q -p no:cacheprovider tests/gpu/test_parallel_graphs.py \
  > $OUT/pg.txt 2>&1
echo "parallel graphs rc=$?"
grep -vE "^\s*$" $OUT/pg.txt | grep -vE "Warning|warn" | tail -40
