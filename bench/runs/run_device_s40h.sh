#!/bin/bash
# Session 40, one H200: Nsight metrics and the source-level stall lines of the two-producer WS FP8 GLU at 8K (s40g:
# the WS FP8 MoE call -4 % at 16K, +3.5 % at 8K against the default): do the consumers still wait on `ready`?
source bench/runs/lib.sh
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
M=$MMA_METRICS
KERNEL="_glu_fp8_ws" ncu_cmd 100 2 "$M" bench/flags.py $W.PRODUCERS=2 -- bench/bench_moe_flags.py --ms 8192 \
  "ws:$F.FP8_GLU=True,$G.WS_GLU=True"
KERNEL="_glu_fp8_ws" ncu_src 100 ws2p bench/flags.py $W.PRODUCERS=2 -- bench/bench_moe_flags.py --ms 8192 \
  "ws:$F.FP8_GLU=True,$G.WS_GLU=True" | head -14
