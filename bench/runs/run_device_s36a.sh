#!/bin/bash
# Session 36, one H200 (≈ 6 min): the GPU tests of what no device call has seen -- session 35's
# `moe_wide_async.tile_block` and `_spread_experts`, session 36's removal of moe_wide_fp8 / moe_wide_ws (the re-encode
# now in e4m3_reencode) and the one-pass "row" mHC finish -- the whole MoE and mHC test files, then the model tests.
# (The figures: run_device_s36b.sh.)
source bench/runs/lib.sh
run 300 tests/gpu/test_moe.py tests/gpu/test_moe_wide.py tests/gpu/test_mhc.py
run 150 tests/gpu/test_model_gpu.py -k "logits_match or greedy or prefill"
