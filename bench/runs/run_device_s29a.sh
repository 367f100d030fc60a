#!/bin/bash
# Prepared in session 28 for session 29, one H200 (≈ 6 min): (1) the warp-specialised GEMMs (moe_wide.WS_GLU /
# WS_DOWN, dsv4/kernels/moe_wide_ws.py, compiled offline only): their GPU test first, under a short limit (a hang
# on an mbarrier would otherwise eat the call), then the Flash MoE call against the default, ms L2-flushed; (2) the host
# side of eager 2048-token prefill forwards of 4 Flash layers (s28j: 45.5 ms of wall time for 17.8 ms of GPU time),
# CPU time by torch op and part; (3) the MoE kernels' GPU tests on the tree as it stands.
source bench/runs/lib.sh
run 150 tests/gpu/test_moe_wide.py -k ws_kernels
C=dsv4.kernels.moe_wide
if grep -q " passed" $OUT/pytest_150.txt && ! grep -qE "failed|Timeout|timed out" $OUT/pytest_150.txt; then
  timeout 150 python3 bench/bench_moe_flags.py --ms 2048,4096,8192,16384 "default:" "ws glu:$C.WS_GLU=True" \
    "ws down:$C.WS_DOWN=True" "ws both:$C.WS_GLU=True,$C.WS_DOWN=True" 2>&1 | tail -5
else
  echo "WS kernels' tests did not all pass: no A/B"; tail -20 $OUT/pytest_150.txt
fi
TOP=45 timeout 150 python3 bench/profile_step.py --layers 4 --prefill 2048 --prefix 6144 --host --eager 2>&1 | tail -50
run 220 tests/gpu/test_moe_wide.py
