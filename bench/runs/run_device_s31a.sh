#!/bin/bash
# Prepared in session 30 for session 31, one H200 (≈ 5 min): where the prefill's two largest kernels stall, per SASS
# instruction (Nsight Compute source counters, `ncu_src` in lib.sh; reports kept in $OUT). s30c's per-warp stall
# ratios of the warp-specialised GLU put long scoreboard (global / local memory) first at 4.94 per issue, not shared
# memory; which instructions? (1) the default GLU (`_wide_async_kernel`, first launch at M = 8192), (2) the WS GLU
# (`_ws_kernel`), (3) the CSA prefill attention at 8K (`_prefill_attn_kernel`, 255 registers + 200 B spilled).
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
# (0) moe_align "blocks" with session 30's per-expert-slice prefix kernel (replacing the one-program cursor walk):
#     its GPU test before anything else; if it fails, set moe_align.LARGE = "sort" (GPU-tested) and say so
run 60 tests/gpu/test_moe_align.py
echo "default GLU"; ncu_src 120 glu bench/bench_moe_flags.py --ms 8192 "default:" | head -40
echo "WS GLU"; KERNEL=_ws_kernel ncu_src 120 ws_glu bench/bench_moe_flags.py --ms 8192 \
  "ws glu:dsv4.kernels.moe_wide.WS_GLU=True" | head -40
# (4) the prefill attention with 32-key tiles and deeper prefetch (offline TTGIR: 3 stages give the window loop 3
#     K slots and a wait that leaves one tile in flight; 2 stages wait for every copy before each tile's QK, s30e)
timeout 90 python3 bench/bench_prefill_glue.py --skip select queries --kv-one-load \
  --shapes 512,64,8,2 512,32,8,3 512,32,8,4 512,32,8,5 256,16,4,2 2>&1 | tail -4
# (256,16,4,2: half the head dim per program, one warpgroup, 16-key tiles: 255 registers, no spills, 114,752 B of
#  shared memory, so two programs per SM interleave; twice the instructions per key in all (scores recomputed))
echo "CSA prefill attention"; KERNEL=_prefill_attn_kernel ncu_src 120 attn bench/bench_prefill_glue.py \
  --skip select queries --kv-one-load --shapes 512,64,8,2 | head -40
