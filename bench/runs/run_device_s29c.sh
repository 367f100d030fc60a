#!/bin/bash
# Session 29, one H200 (≈ 3 min): why the warp-specialised GEMMs (s29a: correct, but GLU 9.19 vs 6.87 ms for the
# whole Flash MoE call at M = 8192) are slow. moe_wide_ws.PROBE removes one partition's work (1: no wgmma, 2: no
# widening), so each row is that partition's floor; then deeper rings. Whole MoE call, ms, L2 flushed.
source bench/runs/lib.sh
C=dsv4.kernels.moe_wide
W=dsv4.kernels.moe_wide_ws
timeout 280 python3 bench/bench_moe_flags.py --ms 8192 "default:" "ws glu:$C.WS_GLU=True" \
  "ws glu no mma:$C.WS_GLU=True,$W.PROBE=1" "ws glu no widen:$C.WS_GLU=True,$W.PROBE=2" \
  "ws glu S2=4:$C.WS_GLU=True,$W.S2=4" "ws glu S1=6 S2=3:$C.WS_GLU=True,$W.S1=6,$W.S2=3" \
  "ws down:$C.WS_DOWN=True" "ws down no mma:$C.WS_DOWN=True,$W.PROBE=1" \
  "ws down no widen:$C.WS_DOWN=True,$W.PROBE=2" 2>&1 | tail -3
python3 -c "import bench.bench_gemm_moe as b; print(b.ceilings())" 2>&1 | tail -2
