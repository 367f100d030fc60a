#!/bin/bash
# Session 40, one H200: the warp-specialized FP8 MoE GEMMs (dsv4.kernels.moe_fp8_ws, moe_glu_fp8.WS; producer warps
# copy and re-encode, a consumer warpgroup per 64 rows multiplies). The FP8 MoE GPU tests (WS bit-identical to the
# shared-warp kernel), the ceilings and the Flash MoE call (default / WS down / FP8 GLU / FP8 GLU + WS), Nsight
# metrics of the WS launches at 8K.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py -k "fp8"
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
timeout 200 python3 bench/bench_moe_flags.py --ms 2048,8192,16384 "default:" "ws:$G.WS=True" \
  "fp8 glu:$F.FP8_GLU=True" "fp8 glu ws:$F.FP8_GLU=True,$G.WS=True" 2>&1 | tail -4
M=$MMA_METRICS
KERNEL="_glu_fp8" ncu_cmd 150 4 "$M" bench/bench_moe_flags.py --ms 8192 "ws:$F.FP8_GLU=True,$G.WS=True"
