#!/bin/bash
# Session 36, one H200 (≈ 6 min): the figures. (1) The "row" mHC finish in one pass (a 4096-column row per program,
# the norm from registers) against the default split finish at prefill sizes: µs per site (hc_pre, hc_post_pre at
# 8K tokens, Flash width) and the 8-layer 8K prefill. (2) Where an 8K prefill's GPU time goes today: 4 Flash layers
# (SWA, SWA, CSA, HCA) in one forward, the kernel table and each layer's GPU µs with the per-kind full-model sum.
# (3) Nsight on the prefill mHC site's two launches (the mix, the split finish): DRAM bytes, issue activity, stalls.
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
for c in split row; do
  echo "COLLAPSE_PREFILL=$c"
  timeout 100 python3 bench/flags.py dsv4.kernels.mhc.COLLAPSE_PREFILL="'$c'" -- bench/sweep_mhc_mix.py \
    --ops hc_pre,hc_post_pre --rows 32 --cols 64 --warps 4 --calls 3 2>&1 | grep default
done
prefill8 100
prefill8 100 "dsv4.kernels.mhc.COLLAPSE_PREFILL='row'"
timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -vE "^\s*$|Warning|warn" | head -60
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M="$M,lts__t_bytes.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread"
M="$M,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
KERNEL="_mix_kernel|_finish_split" ncu_cmd 150 2 "$M" bench/sweep_mhc_mix.py --ops hc_post_pre --rows 32 --cols 64 \
  --warps 4 --calls 1
