#!/bin/bash
# Prepared in session 47 for session 48 (≈ 3 min), after s48a: Nsight Compute on the decode MoE's GEMVs at one token
# (bench/bench_moe_stages.py, two calls): the Triton GLU and the persistent Gluon kernel (and the down, if on) -- time,
# DRAM throughput, issue activity and the top stall reasons, to say whether the Gluon GLU is bound by its consumers'
# issue (session 47's reading: one consumer slower than Triton, two level) or by something else.
source bench/runs/lib.sh
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL="_mma_glu_kernel|_stream_kernel|_mma_down_kernel" ncu_cmd 170 8 "$M" bench/bench_moe_stages.py --tokens 1 --calls 2
