#!/bin/bash
# Session 74: what bounds the prefill MoE's FP8 down GEMM (`_glu_fp8_ws_kernel`, 1.9 ms per layer at 8K tokens,
# ≈ 36 % of the FP8 peak): its L2 / DRAM bytes (the token codes are read once per 128-channel program column,
# 32 times per row of tiles: ≈ 3.2 GB of L2 reads expected), tensor pipe, issue and stall reasons, then the SASS lines
# with the most stall samples; the bf16 GLU (`_wide_async_kernel`) beside it for scale.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
BYTES=dram__bytes_read.sum,lts__t_bytes.sum,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_sector_hit_rate.pct
BYTES="$BYTES,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for k in _glu_fp8_ws _wide_async; do
  echo "== $k"
  KERNEL=$k ncu_cmd 240 2 "$MMA_METRICS,$BYTES" bench/ncu_kernels.py --only prefill
done
echo "== _glu_fp8_ws source"
KERNEL=_glu_fp8_ws ncu_src 240 down_src bench/ncu_kernels.py --only prefill | head -40
