#!/bin/bash
# Session 16, nvidia-h200-x2, call 1 of 2: (1) the symmetric-memory all-reduce against NCCL bit for bit; (2) the
# sharded graph test with per-phase timestamps and stacks on a hang (session 15b's run printed nothing within 300 s:
# a hang, or only kernel compilation in two processes at once), now also with MTP speculation across ranks.
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), hasattr(torch.ops.symm_mem, 'one_shot_all_reduce_copy_out'))"
run 100 tests/gpu/test_fast_allreduce.py
DSV4_TEST_HANG_S=420 timeout 440 python3 -m pytest -x -s -q -p no:cacheprovider tests/gpu/test_parallel_graphs.py \
  > $OUT/pg.txt 2>&1
echo "parallel graphs rc=$?"
grep -vE "^\s*$" $OUT/pg.txt | grep -vE "Warning|warn" | tail -45
