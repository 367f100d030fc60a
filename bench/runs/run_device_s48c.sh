#!/bin/bash
# Session 48 (≈ 2 min): the decode GLU's step loop with fewer CTA barriers -- the activation scales from global memory
# (SA_GLOBAL) and the slot freed after the step's MMAs (FREE_LATE): its tests, the MoE call A/B against the session-47
# kernel (both off), and Nsight's stall reasons of the new one at one token.
# (Run once; both switches were then made unconditional and removed: a re-run stops at the first variant.)
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
gate 200 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "s47 (both off):$G.SA_GLOBAL=False,$G.FREE_LATE=False" \
  "sa global only:$G.FREE_LATE=False" "free late only:$G.SA_GLOBAL=False" "default again:" 2>&1 | tail -5
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL=_stream_kernel ncu_cmd 100 2 "$M" bench/bench_moe_stages.py --tokens 1 --calls 2
