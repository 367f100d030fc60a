#!/bin/bash
# Session 35, one H200: moe_glu_fp8 with the re-encode's inputs (scale words, tile maxima: int32 now) brought by the
# cp.async ring with the block (s35c: loaded one block ahead by plain loads they still stalled it). GPU tests, the
# Flash MoE call (default vs FP8 GLU + down, down only, GLU only), Nsight metrics and the source-level stall lines
# of the FP8 launches at 8K, the 8-layer prefill default vs FP8 down vs both.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 150 tests/gpu/test_moe_wide.py -k "fp8_glu or fp8_operands"
F=dsv4.kernels.moe_wide
timeout 150 python3 bench/bench_moe_flags.py --ms 2048,4096,8192 "default:" "fp8:$F.FP8_GLU=True,$F.FP8_DOWN=True" \
  "fp8 down:$F.FP8_DOWN=True" "fp8 glu:$F.FP8_GLU=True" 2>&1 | tail -4
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL="_glu_fp8" ncu_cmd 150 4 "$M" bench/bench_moe_flags.py --ms 8192 "fp8:$F.FP8_GLU=True,$F.FP8_DOWN=True"
KERNEL="_glu_fp8" ncu_src 150 glu_fp8 bench/bench_moe_flags.py --ms 8192 "fp8:$F.FP8_GLU=True,$F.FP8_DOWN=True" \
  | head -20
prefill8 100
prefill8 100 $F.FP8_DOWN=True
prefill8 100 $F.FP8_GLU=True $F.FP8_DOWN=True
