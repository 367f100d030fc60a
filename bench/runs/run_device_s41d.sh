#!/bin/bash
# Session 41 (≈ 5 min): the WS producer's codes copied 4 threads per row (two 16-byte chunks each, one pointer:
# producer loop 410 -> 401 SASS); its tests; the 4-layer 8K forward (profile_step) with the default, the WS down GEMM,
# the WS GLU + down; the source-level stall lines of the WS GLU at 8K.
source bench/runs/lib.sh
run 250 tests/gpu/test_moe_wide.py -k "ws"
F=dsv4.kernels.moe_wide
G=dsv4.kernels.moe_glu_fp8
for flags in "$G.WS_DOWN=False" "$G.WS_DOWN=True" "$G.WS_DOWN=True $F.FP8_GLU=True $G.WS_GLU=True"; do
  echo "flags: $flags"; ktab 200 "_glu_fp8|_wide_async" $flags
done
KERNEL="_glu_fp8_ws" ncu_src 100 ws41 bench/bench_moe_flags.py --ms 8192 "ws:$F.FP8_GLU=True,$G.WS_GLU=True" | head -34
