#!/bin/bash
# Runs on commit f564861 (its kernels and bench options were measured and reverted in the commit after it).
# Session 28, one H200 (≈ 2 min): the down GEMM's 128-row tiles through registers (the new static ring: 2.40 vs
# 2.67 ms through shared memory at M = 8192 alone, s28g) but slower inside the MoE call (7.10 vs 6.85): is it the
# launch order (ASYNC_GROUP_M = 4 in the MoE, 0 in bench_moe_wide_shapes)?
source bench/runs/lib.sh
C=dsv4.kernels.moe_wide
timeout 200 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "down reg:$C.ASYNC_A_SMEM=False" \
  "order 0:$C.ASYNC_GROUP_M=0" "down reg, order 0:$C.ASYNC_A_SMEM=False,$C.ASYNC_GROUP_M=0" \
  "order 8:$C.ASYNC_GROUP_M=8" 2>&1 | tail -4
