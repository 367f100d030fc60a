#!/bin/bash
# Runs on commit f564861 (its kernels and bench options were measured and reverted in the commit after it).
# Session 28, one H200 (≈ 3 min): why the split GLU with 256-token tiles (a third fewer instructions per MMA) was
# only 3 % faster per padded FLOP than the default GLU (s28d): Nsight Compute on both (the first launch of each
# bench), then both timed with the widening replaced by a bit cast (DSV4_NO_WIDEN=1, a temporary patch of
# moe_wide_async that this script's commit does not hold; outputs meaningless, times only).
source bench/runs/lib.sh
M="gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
ncu_cmd 100 1 "$M" bench/bench_moe_wide_shapes.py --ms 8192 --shapes 64,4,reg,4
ncu_cmd 100 3 "$M" bench/bench_moe_wide_shapes.py --ms 8192 --bm 256 --shapes 128,8,split,4
DSV4_NO_WIDEN=1 timeout 100 python3 bench/bench_moe_wide_shapes.py --ms 8192 --shapes 64,4,reg,4 2>&1 | tail -1
DSV4_NO_WIDEN=1 timeout 100 python3 bench/bench_moe_wide_shapes.py --ms 8192 --bm 256 --shapes 128,8,split,4 \
  2>&1 | tail -1
