#!/bin/bash
# Prepared in session 38 for session 39, one H200 (≈ 4 min): is the Gluon prefill attention bound by the bytes its
# key tiles bring from L2? (s36c: 5.9 GB from L2 into L1 in 2.70 ms for one CSA layer at 8K, ≈ 2.2 TB/s; s38e: 32-key
# tiles +25 %, so per-tile costs matter too.) Nsight on the first launch of each layer kind (CSA, HCA, SWA in
# bench_prefill_glue's order): time, tensor pipe, issue, L2 and L1 throughput as % of their peaks, the L2 -> L1
# bytes, DRAM %, and the stalls per issue. If L2 (lts) or the L1 fill path (l1tex m_xbar2l1tex) is near its peak,
# FP8 key tiles (≈ 57 % of the bytes) are the next step; if not, the per-tile latency chain is. Then the indexer q
# glue's launch shape (norm_rope HADAMARD_ROWS x HADAMARD_WARPS, 177 µs at 8K in s37d): its tests (the same bits on
# every shape) and the four shapes' times; make the fastest the default.
source bench/runs/lib.sh
M=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__m_xbar2l1tex_read_bytes.sum"
M="$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active"
M="$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL=_attn_kernel ncu_cmd 200 3 "$M" bench/bench_prefill_glue.py --skip select queries --shapes gluon
run 150 tests/gpu/test_norm_rope.py
N=dsv4.kernels.norm_rope
for cfg in "64 4" "32 4" "64 8" "128 8"; do
  read r w <<< "$cfg"
  echo -n "rows $r warps $w: "
  timeout 60 python3 bench/flags.py $N.HADAMARD_ROWS=$r $N.HADAMARD_WARPS=$w -- bench/bench_prefill_glue.py \
    --skip select attention 2>&1 | grep "indexer q"
done
