#!/bin/bash
# Prepared in session 38 for session 39, one H200 (≈ 4 min): is the Gluon prefill attention bound by the bytes its
# key tiles bring from L2? (s36c: 5.9 GB from L2 into L1 in 2.70 ms for one CSA layer at 8K, ≈ 2.2 TB/s; s38e: 32-key
# tiles +25 %, so per-tile costs matter too.) Nsight on the first launch of each layer kind (CSA, HCA, SWA in
# bench_prefill_glue's order): time, tensor pipe, issue, L2 and L1 throughput as % of their peaks, the L2 -> L1
# bytes, DRAM %, and the stalls per issue. If L2 (lts) or the L1 fill path (l1tex m_xbar2l1tex) is near its peak,
# FP8 key tiles (≈ 57 % of the bytes) are the next step; if not, the per-tile latency chain is.
source bench/runs/lib.sh
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__m_xbar2l1tex_read_bytes.sum"
M="$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active"
M="$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL=_attn_kernel ncu_cmd 200 3 "$M" bench/bench_prefill_glue.py --skip select queries --shapes gluon
