#!/bin/bash
# Prepared in sessions 13/14 (not yet run), nvidia-h200-x2: CUDA-graph decode for sharded models (NCCL
# collectives captured in the paged whole-step graphs) against eager on the same ranks, then full Flash on
# two GPUs with graphs. If both are green: lift run_parallel's refusal of --cuda-graphs (dsv4/distributed/cli.py).
source bench/runs/lib.sh
export NCCL_NVLS_ENABLE=0  # NVLink multicast off (device KINDS.md)
run 300 tests/gpu/test_parallel_graphs.py
timeout 250 python3 bench/bench_parallel.py --world 2 --reps 4 --batches 1,8,64 --ctx 4096 \
  --kv-dtype fp8 --prefill 8192 --cuda-graphs 2>&1 | grep -E "ceilings|prefill|B=|Error|rror" | head -20
