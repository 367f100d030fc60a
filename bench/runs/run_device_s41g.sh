#!/bin/bash
# Session 41 (≈ 5 min): the WS down GEMM as the default -- the MoE GPU tests; Pro's MoE call with it against the
# shared-warp down (bit-identical outputs expected: "same" 1.0000); the Flash call with other WS ring sizes.
source bench/runs/lib.sh
run 330 tests/gpu/test_moe_wide.py tests/gpu/test_moe.py
G=dsv4.kernels.moe_glu_fp8
W=dsv4.kernels.moe_fp8_ws
timeout 150 python3 bench/bench_moe_flags.py --experts pro --ms 4096,8192 "ws down (default):" \
  "shared-warp down:$G.WS_DOWN=False" 2>&1 | grep -vE "^\s*$|^  File|^    " | tail -3
timeout 150 python3 bench/bench_moe_flags.py --ms 8192,16384 "ws down (default):" "shared-warp down:$G.WS_DOWN=False" \
  "x5 w4:$W.XSLOTS=5,$W.WSLOTS=4" "x6 w4:$W.WSLOTS=4" 2>&1 | grep -vE "^\s*$|^  File|^    " | tail -3
