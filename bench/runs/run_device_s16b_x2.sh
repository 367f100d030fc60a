#!/bin/bash
# Session 16, nvidia-h200-x2: (1) the symmetric-memory all-reduce against NCCL bit for bit; (2) full Flash on two
# GPUs with graphs and the fast path (its ceilings line times NCCL vs fast rows in graphs); (3) the sharded graph
# test with per-phase timestamps and stacks on a hang (session 15b's run printed nothing within 300 s), now also
# with MTP speculation across ranks.
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), hasattr(torch.ops.symm_mem, 'one_shot_all_reduce_copy_out'))"
run 120 tests/gpu/test_fast_allreduce.py
timeout 170 python3 bench/bench_parallel.py --world 2 --reps 4 --batches 1,8 --ctx 4096 --kv-dtype fp8 --prefill 0 \
  --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -12
DSV4_TEST_HANG_S=190 timeout 215 python3 -m pytest -x -s -q -p no:cacheprovider tests/gpu/test_parallel_graphs.py \
  > $OUT/pg.txt 2>&1
echo "parallel graphs rc=$?"
grep -vE "^\s*$" $OUT/pg.txt | grep -vE "Warning|warn" | tail -45
