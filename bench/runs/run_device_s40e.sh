#!/bin/bash
# Session 40, one H200: s40d's MoE call again with its whole output (a CUDA error cut the table short there); the
# 8-code-slot / 2-weight-slot variant last.
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
timeout 200 python3 bench/bench_moe_flags.py --ms 8192,16384 "fp8 glu:$F.FP8_GLU=True" \
  "ws4:$F.FP8_GLU=True,$G.WS=True" "ws8:$F.FP8_GLU=True,$G.WS=True,$W.PRODUCER_WARPS=8" "default:" \
  "default ws:$G.WS=True" 2>&1 | tail -4
timeout 100 python3 bench/bench_moe_flags.py --ms 8192 "fp8 glu:$F.FP8_GLU=True" \
  "ws x8 w2:$F.FP8_GLU=True,$G.WS=True,$W.XSLOTS=8,$W.WSLOTS=2" 2>&1 | grep -vE "^\s*$|^  File|^    " | tail -6
