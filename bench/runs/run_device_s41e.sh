#!/bin/bash
# Session 41 (≈ 4 min): the new warp-specialized bf16 GLU (moe_bf16_ws, moe_wide.WS_BF16_GLU): its bit-identity
# tests; the Flash MoE call at 4K / 8K / 16K against the default (two producers; one; 5 activation slots); Nsight
# metrics of its 8K launch.
source bench/runs/lib.sh
run 300 tests/gpu/test_moe_wide.py -k "bf16_ws"
F=dsv4.kernels.moe_wide
B=dsv4.kernels.moe_bf16_ws
timeout 250 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "ws bf16:$F.WS_BF16_GLU=True" \
  "ws bf16 1p:$F.WS_BF16_GLU=True,$B.PRODUCERS=1" "ws bf16 x5:$F.WS_BF16_GLU=True,$B.XSLOTS=5" 2>&1 \
  | grep -vE "^\s*$|^  File|^    " | tail -5
M=$MMA_METRICS
KERNEL="_glu_bf16_ws|_wide_async" ncu_cmd 100 2 "$M" bench/bench_moe_flags.py --ms 8192 "ws:$F.WS_BF16_GLU=True"
KERNEL="_wide_async" ncu_cmd 100 2 "$M" bench/bench_moe_flags.py --ms 8192 "default:"
