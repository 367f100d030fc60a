#!/bin/bash
# Prepared in session 28 for session 29, one H200 (≈ 7 min): the warp-specialised GEMMs (moe_wide.WS_GLU / WS_DOWN,
# dsv4/kernels/moe_wide_ws.py, compiled offline only): their GPU test first, under a limit (a hang on an mbarrier
# would otherwise eat the call), then the Flash MoE call against the default, ms L2-flushed. Then run_device_s29b.sh.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py -k ws_kernels
C=dsv4.kernels.moe_wide
W=dsv4.kernels.moe_wide_ws.WIDENERS=2
if grep -q " passed" $OUT/pytest_200.txt && ! grep -qE "failed|Timeout|timed out" $OUT/pytest_200.txt; then
  timeout 200 python3 bench/bench_moe_flags.py --ms 2048,4096,8192,16384 "default:" "ws glu:$C.WS_GLU=True" \
    "ws down:$C.WS_DOWN=True" "ws both:$C.WS_GLU=True,$C.WS_DOWN=True" \
    "ws both, 2 wideners:$C.WS_GLU=True,$C.WS_DOWN=True,$W" 2>&1 | tail -5
else
  echo "WS kernels' tests did not all pass: no A/B"; tail -20 $OUT/pytest_200.txt
fi
