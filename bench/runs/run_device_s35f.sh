#!/bin/bash
# Session 35, one H200: moe_wide.FP8_DOWN on by default from FP8_DOWN_MIN_PAIRS_PER_EXPERT -- its GPU tests (the
# threshold at Flash and Pro dims, the FP8 kernels, a bit-for-bit bf16 comparison with the flag pinned off) and the
# Flash MoE call default vs the bf16 down GEMM.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe.py tests/gpu/test_moe_wide.py -k "threshold or real_dims or fp8 or mixed_tiles_match"
F=dsv4.kernels.moe_wide
timeout 100 python3 bench/bench_moe_flags.py --ms 2048,8192 "default:" "bf16 down:$F.FP8_DOWN=False" 2>&1 | tail -3
