#!/bin/bash
# Prepared in session 40 for session 41, one H200 (≈ 3 min): moe_fp8_ws after its offline trims (unmeasured):
# the four re-encoded group buffers as separate allocations (Triton's barrier analysis had put three partition
# barriers per block between their stores: the producer loop's BAR count 8 -> 5), the ready / free mbarriers as two
# allocations, the free wait without a branch (parity of the phase before a fresh barrier's first), the consumers'
# scale loads ahead of their MMAs. The WS tests (bit-identical to the shared-warp kernel), the ceilings, the Flash
# MoE call at 4K / 8K / 16K (default; FP8 GLU + down via WS, two producers; the same with one), Nsight metrics of the
# WS GLU at 8K. Compare with s40g: default 5.919 / WS 6.126 ms at 8K, 11.384 / 10.927 at 16K.
source bench/runs/lib.sh
run 250 tests/gpu/test_moe_wide.py -k "ws"
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
timeout 200 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" \
  "ws:$F.FP8_GLU=True,$G.WS_GLU=True,$G.WS_DOWN=True" \
  "ws 1 producer:$F.FP8_GLU=True,$G.WS_GLU=True,$G.WS_DOWN=True,$W.PRODUCERS=1" 2>&1 \
  | grep -vE "^\s*$|^  File|^    " | tail -4
M=$MMA_METRICS
KERNEL="_glu_fp8_ws" ncu_cmd 100 2 "$M" bench/bench_moe_flags.py --ms 8192 "ws:$F.FP8_GLU=True,$G.WS_GLU=True"
