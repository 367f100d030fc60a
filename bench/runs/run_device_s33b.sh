#!/bin/bash
# Prepared in session 32 for session 33, one H200 (≈ 5 min), after s33a. The Gluon MoE kernels' launch knobs were
# tuned before session 32's two store fixes (requant, ASYNC_STORE_T: the epilogue now goes through shared memory,
# 16-byte stores): re-sweep them on the Flash MoE call, then Nsight's tensor-pipe share and time per GEMM launch
# (the first 4 Gluon launches of an 8K call: GLU 128- and 64-row tiles, down 128- and 64-row tiles).
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
W=dsv4.kernels.moe_wide
timeout 200 python3 bench/bench_moe_flags.py --ms 2048,8192 "default:" "stages3:$W.ASYNC_STAGES=3" \
  "stages5:$W.ASYNC_STAGES=5" "group8:$W.ASYNC_GROUP_M=8" "group2:$W.ASYNC_GROUP_M=2" \
  "down1wg:$W.DOWN_ONE_WARPGROUP=True" "default2:" 2>&1 | tail -3
M="gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,launch__registers_per_thread,launch__occupancy_limit_shared_mem,smsp__inst_executed.sum"
ncu_moe 150 4 "$M"
