#!/bin/bash
# Session 40, one H200: s40f: two 4-warp producers (PRODUCERS=2, raw ring of 3) made the WS FP8 GLU the fastest
# MoE call at 16K (10.80 vs default 10.35 ms) but not at 8K (6.13 vs 6.05). Now WS_GLU / WS_DOWN apart and the raw
# ring sized per producer count: the WS tests, the ceilings, the Flash MoE call at 4K / 8K / 16K (default; FP8 GLU
# through WS; + WS down; WS down alone), then the 4-layer 8K forward's kernel table default vs FP8 GLU + WS.
source bench/runs/lib.sh
run 250 tests/gpu/test_moe_wide.py -k "ws"
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
timeout 200 python3 bench/flags.py $W.PRODUCERS=2 -- bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" \
  "glu ws:$F.FP8_GLU=True,$G.WS_GLU=True" "glu+down ws:$F.FP8_GLU=True,$G.WS_GLU=True,$G.WS_DOWN=True" \
  "down ws:$G.WS_DOWN=True" 2>&1 | grep -vE "^\s*$|^  File|^    " | tail -4
ktab 120 "_wide_async|_glu_fp8" $W.PRODUCERS=2
ktab 120 "_wide_async|_glu_fp8" $W.PRODUCERS=2 $F.FP8_GLU=True $G.WS_GLU=True
