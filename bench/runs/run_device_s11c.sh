#!/bin/bash
# Session 11: the GLU on one warpgroup per program, GEMM2 on two (moe_wide.GLU_ONE_WARPGROUP, the new
# default, from s11a's per-GEMM table) -- its tests, the MoE call against the old default, the 8K prefill;
# then why `bench_parallel --prefill 8192`'s decode after the prompt read 20-39 ms per step in s11a/s11b:
# the same 8 layers' decode at ctx 8192 on the normal path, and a profile of one eager step at ctx 8192.
source "$(dirname "$0")/lib.sh"
run 100 tests/gpu/test_moe_wide.py -k "async_kernel_matches or requant or other_ranks"
timeout 100 python3 bench/bench_moe_flags.py --ms 2048,4096,8192 "default:" \
    "two warpgroups (old):dsv4.kernels.moe_wide.GLU_ONE_WARPGROUP=False"
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29520
timeout 120 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 5 --batches 1 --ctx 8192 --kv-dtype fp8 \
    --prefill 8192 2>&1 | grep -vE "^ *$" | tail -12
timeout 100 python3 bench/profile_step.py --layers 4 --ctx 8192 2>&1 | tail -40
