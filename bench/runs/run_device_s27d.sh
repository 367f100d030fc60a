#!/bin/bash
# Session 27, one H200: the bf16 widening as the only Gluon path (the f16 one removed): its exhaustive table
# through shared memory, the MoE kernels' tests and the model's GPU tests; where the MoE's tile-size rules sit
# now that the widening is cheaper (the wide kernel from fewer pairs per expert, mixed tiles from fewer);
# Nsight Compute on the GLU (where its cycles go now).
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py
run 200 tests/gpu/test_model_gpu.py
C=dsv4.kernels.moe_config
timeout 150 python3 bench/bench_moe_flags.py --ms 1024,1536,2048,4096,8192 "default:" \
  "wide from 16 per expert:$C.WIDE64_MIN_PAIRS_PER_EXPERT=16" "mixed from 64:$C.MIXED_MIN_PAIRS_PER_EXPERT=64" \
  "128-row from 48:$C.WIDE_MIN_PAIRS_PER_EXPERT=48" 2>&1 | tail -6
M="gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
ncu_moe 120 2 "$M"
