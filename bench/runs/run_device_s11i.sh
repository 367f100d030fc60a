#!/bin/bash
# Session 11: the FP8-operand MoE (moe_wide.WIDE_FP8, opt-in) with the re-encode PTX that takes each row's prmt
# tables precomputed and does both nibbles of a word at once (SASS loop: 1,223 -> 1,117 instructions per
# pair of blocks): its tests, then the MoE call against the default (s11b, old form: 4.98 / 9.34 / 16.05 ms).
source "$(dirname "$0")/lib.sh"
run 90 tests/gpu/test_moe_wide.py -k "fp8"
timeout 90 python3 bench/bench_moe_flags.py --ms 2048,4096,8192 "default:" "fp8 bm64:dsv4.kernels.moe_wide.WIDE_FP8=True"
