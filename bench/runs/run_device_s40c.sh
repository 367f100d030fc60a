#!/bin/bash
# Session 40, one H200: s40b found moe_fp8_ws correct (bit-identical) but no faster than the shared-warp kernel
# (GLU tensor pipe 26 %, long-scoreboard stalls first). Here: its tests with 4- and 8-warp producers, the Flash MoE
# call with the FP8 GLU (shared / WS 4-warp producer / 8-warp producer / 8-warp with a 6-block raw ring), and the
# source-level stall lines of the 8-warp WS GLU at 8K.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py -k "ws"
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
timeout 200 python3 bench/bench_moe_flags.py --ms 8192,16384 "fp8 glu:$F.FP8_GLU=True" \
  "ws4:$F.FP8_GLU=True,$G.WS=True" "ws8:$F.FP8_GLU=True,$G.WS=True,$W.PRODUCER_WARPS=8" \
  "ws8 raw6:$F.FP8_GLU=True,$G.WS=True,$W.PRODUCER_WARPS=8,$W.RAW=6" "default:" 2>&1 | tail -3
KERNEL="_glu_fp8_ws" ncu_src 150 ws8 bench/flags.py $W.PRODUCER_WARPS=8 -- bench/bench_moe_flags.py --ms 8192 \
  "ws:$F.FP8_GLU=True,$G.WS=True" | head -32
