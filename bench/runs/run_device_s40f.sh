#!/bin/bash
# Session 40, one H200: s40d/e showed moe_fp8_ws's consumers waiting on `ready` (a third of the stall samples): the
# producer's per-block chain (copy wait, barrier, re-encode, fence, barrier) is the limit, and 8 warps in one
# producer did not shorten it. Here two 4-warp producers take alternate blocks (PRODUCERS=2). Its tests (one producer
# of 4 / 8 warps, two of 4), the Flash MoE call, Nsight metrics of the WS GLU at 8K.
source bench/runs/lib.sh
run 250 tests/gpu/test_moe_wide.py -k "ws"
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
timeout 200 python3 bench/bench_moe_flags.py --ms 8192,16384 "fp8 glu:$F.FP8_GLU=True" \
  "ws 1x4:$F.FP8_GLU=True,$G.WS=True" "ws 2x4:$F.FP8_GLU=True,$G.WS=True,$W.PRODUCERS=2" \
  "ws 2x4 raw3:$F.FP8_GLU=True,$G.WS=True,$W.PRODUCERS=2,$W.RAW=3" "default:" \
  "default + ws 2x4 down:$G.WS=True,$W.PRODUCERS=2" 2>&1 | grep -vE "^\s*$|^  File|^    " | tail -4
M=$MMA_METRICS
KERNEL="_glu_fp8" ncu_cmd 150 2 "$M" bench/flags.py $W.PRODUCERS=2 -- bench/bench_moe_flags.py --ms 8192 \
  "ws:$F.FP8_GLU=True,$G.WS=True"
