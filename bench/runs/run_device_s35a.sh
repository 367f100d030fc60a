#!/bin/bash
# Prepared in session 34 for session 35, one H200 (≈ 4 min): what bounds the final Gluon prefill attention (the
# early-refill loop, CSA 2.20 ms per layer at 8K) -- Nsight Compute's metrics and stall reasons on one CSA launch (as
# s34d took on the first version: tensor pipe 32.5 %, barrier 2.48 / long scoreboard 1.71 stalls per issue), then
# the SASS instructions with the most stall samples.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_bytes.sum"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL=_attn_kernel ncu_cmd 200 1 "$M" bench/bench_prefill_glue.py --skip select queries --shapes gluon
KERNEL=_attn_kernel ncu_src 200 attn_src bench/bench_prefill_glue.py --skip select queries --shapes gluon
