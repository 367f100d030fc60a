#!/bin/bash
# Prepared in session 35 for session 36, one H200 (≈ 5 min): the GPU tests of session 35's last commits that no
# device call saw -- `moe_wide_async.tile_block` (the tile start now shared by the bf16 and FP8 Gluon MoE kernels;
# offline SASS only) and `_spread_experts` in test_moe_wide -- the whole MoE test files and the model tests, then
# the Flash MoE call and the 8-layer 8K prefill with the defaults (FP8 down from 96 pairs per expert).
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1
run 300 tests/gpu/test_moe.py tests/gpu/test_moe_wide.py
run 200 tests/gpu/test_model_gpu.py -k "logits_match or greedy or prefill"
F=dsv4.kernels.moe_wide
timeout 100 python3 bench/bench_moe_flags.py --ms 4096,8192 "default:" "bf16 down:$F.FP8_DOWN=False" 2>&1 | tail -3
prefill8 100
prefill8 100 $F.FP8_DOWN=False
