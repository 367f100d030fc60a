#!/bin/bash
# Session 16, nvidia-h200-x2: the symmetric-memory all-reduce (dsv4.distributed.fast_allreduce) against NCCL
# bit for bit, then full Flash on two GPUs with graphs, NCCL only vs the fast path, in the same call.
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), hasattr(torch.ops.symm_mem, 'one_shot_all_reduce_copy_out'))"
run 150 tests/gpu/test_fast_allreduce.py
for F in 1 0; do
  echo "DSV4_FAST_ALLREDUCE=$F"
  DSV4_FAST_ALLREDUCE=$F timeout 200 python3 bench/bench_parallel.py --world 2 --reps 4 --batches 1,8 --ctx 4096 \
    --kv-dtype fp8 --prefill 0 --cuda-graphs 2>&1 | grep -E "ceilings|B=|rror" | head -12
done
