#!/bin/bash
# Session 40, one H200: moe_fp8_ws with the codes' ring (6 blocks) apart from the re-encoded weights' (3), the scales
# through shared memory (s40c: the consumers waited on `ready` and on their own scale loads). Its tests (4- and 8-warp
# producers), the Flash MoE call (shared-warp FP8 GLU / WS / WS 8-warp producer / WS with 8 codes
# slots and 2 weight slots / default / default with the WS down GEMM), Nsight metrics and the
# source-level stall lines of the WS GLU at 8K.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py -k "ws"
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
timeout 200 python3 bench/bench_moe_flags.py --ms 8192,16384 "fp8 glu:$F.FP8_GLU=True" \
  "ws4:$F.FP8_GLU=True,$G.WS=True" "ws8:$F.FP8_GLU=True,$G.WS=True,$W.PRODUCER_WARPS=8" \
  "ws x8 w2:$F.FP8_GLU=True,$G.WS=True,$W.XSLOTS=8,$W.WSLOTS=2" "default:" \
  "default ws:$G.WS=True" 2>&1 | tail -3
M=$MMA_METRICS
KERNEL="_glu_fp8" ncu_cmd 150 2 "$M" bench/bench_moe_flags.py --ms 8192 "ws:$F.FP8_GLU=True,$G.WS=True"
KERNEL="_glu_fp8_ws" ncu_src 150 ws4 bench/bench_moe_flags.py --ms 8192 "ws:$F.FP8_GLU=True,$G.WS=True" | head -24
