#!/bin/bash
# Session 35, one H200: moe_glu_fp8 with its weight scales loaded one block ahead and the packed-byte ring swizzled
# (s35b: long-scoreboard stalls on those loads were the top reason, and 2-way bank conflicts on the ring's reads).
# GPU tests, the Flash MoE call (default vs FP8 GLU + down, ring depths 4 / 6), Nsight metrics of the FP8 launches
# and of the default's bf16 ones at 8K side by side, the FP8 GLU's source-level stall lines, the 8-layer prefill.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 150 tests/gpu/test_moe_wide.py -k "fp8_glu or fp8_operands"
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
timeout 150 python3 bench/bench_moe_flags.py --ms 2048,8192 "default:" "fp8:$F.FP8_GLU=True,$F.FP8_DOWN=True" \
  "fp8 st6:$F.FP8_GLU=True,$F.FP8_DOWN=True,$G.STAGES=6" "fp8 glu:$F.FP8_GLU=True" 2>&1 | tail -4
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
M="$M,lts__t_sectors.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL="_glu_fp8" ncu_cmd 150 4 "$M" bench/bench_moe_flags.py --ms 8192 "fp8:$F.FP8_GLU=True,$F.FP8_DOWN=True"
ncu_cmd 150 4 "$M" bench/bench_moe_flags.py --ms 8192 "default:"
KERNEL="_glu_fp8" ncu_src 150 glu_fp8 bench/bench_moe_flags.py --ms 8192 "fp8:$F.FP8_GLU=True,$F.FP8_DOWN=True" \
  | head -24
prefill8 100
prefill8 100 $F.FP8_GLU=True $F.FP8_DOWN=True
