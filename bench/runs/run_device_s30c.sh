#!/bin/bash
# Prepared in session 29 for session 30, one H200 (≈ 6 min), after run_device_s30b.sh.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
# (1) moe_align.LARGE = "blocks" (three Triton launches instead of the device sort's ≈ 25 torch ops, ≈ 1 ms of host
#     time per call at 8K tokens) and moe_wide.MIXED_TILES_KERNEL (one launch instead of ≈ 25 torch ops), both
#     prepared in session 29 and interpreter-tested bit for bit against their references: their GPU tests, the
#     whole MoE call (GPU time), then fresh 2048-token forwards of 4 layers (wall: the host's side). Make them the
#     defaults if the tests pass and neither is slower.
run 100 tests/gpu/test_moe_align.py
A=dsv4.kernels.moe_align.LARGE
T=dsv4.kernels.moe_wide.MIXED_TILES_KERNEL
timeout 100 python3 bench/bench_moe_flags.py --ms 2048,8192 "sort:" "blocks:$A='blocks'" \
  "blocks + tiles kernel:$A='blocks',$T=True" 2>&1 | tail -3
for V in "$A='sort'" "$A='blocks' $T=True"; do
  echo "$V"
  timeout 70 python3 bench/flags.py $V -- bench/profile_step.py --layers 4 --prefill 2048 2>&1 | grep -E "wall|kernels,"
done
# (2) the warp-specialised GLU (s29: its partitions add up; shared memory explains a floor of ≈ 4.6 ms of its
#     7.0): Nsight Compute on its first launch at M = 8192: tensor pipe, shared-memory wavefronts, stalls per issue.
M="gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
M="$M,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL=_ws_kernel ncu_cmd 150 1 "$M" bench/bench_moe_flags.py --ms 8192 "ws glu:dsv4.kernels.moe_wide.WS_GLU=True"
