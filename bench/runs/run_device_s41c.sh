#!/bin/bash
# Session 41 (≈ 3 min): s41a's call totals imply the WS down GEMM alone beats the shared-warp FP8 down (≈ 1.75 vs
# 2.01 ms at 8K). The Flash MoE call with only the down GEMM through moe_fp8_ws (bf16 GLU kept), two producers / one,
# against the default and WS GLU + down; Nsight times of the down kernels at 8K (shared-warp, WS).
source bench/runs/lib.sh
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
timeout 250 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "ws down:$G.WS_DOWN=True" \
  "ws down 1 producer:$G.WS_DOWN=True,$W.PRODUCERS=1" \
  "ws glu+down:$F.FP8_GLU=True,$G.WS_GLU=True,$G.WS_DOWN=True" 2>&1 \
  | grep -vE "^\s*$|^  File|^    " | tail -4
M=$MMA_METRICS
KERNEL="_glu_fp8" ncu_cmd 100 1 "$M" bench/bench_moe_flags.py --ms 8192 "default:"
KERNEL="_glu_fp8" ncu_cmd 100 1 "$M" bench/bench_moe_flags.py --ms 8192 "ws down:$G.WS_DOWN=True"
