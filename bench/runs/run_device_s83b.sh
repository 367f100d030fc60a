#!/bin/bash
# (moe_glu_decode.DOWN_CHAINS / GLU_CHAINS were removed after session 84's run of run_device_s83b.sh: within 0.5 %,
#  docs/benchmarks.md "Session 84")
# Session 83, one call (≈ 9 min; a cut run keeps what it printed, most useful first) when only one call is likely:
# run_device_s82e.sh's MoE call, then 8 Flash layers' B = 1 rows with the chains (both flags) and
# with the decode mHC finish as "row" (run_device_s83a.sh), off / row / chains alternating.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
D=$G.DOWN_CHAINS=True
B=$G.GLU_CHAINS=True
R="dsv4.kernels.mhc.COLLAPSE='row'"
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "one chain:" "down chains:$D" "glu chains:$B" \
  "both:$D,$B" "one chain:" "down chains:$D" "glu chains:$B" "both:$D,$B" 2>&1 | grep -v -i warn | tail -10
rows8 150 1
rows8 100 1 $R
rows8 100 1 $D $B
rows8 100 1
rows8 100 1 $R
rows8 100 1 $D $B
# the chains' equality test last (a flag is adopted only after it passes; the timings come first in a short call)
gate 200 tests/gpu/test_moe_glu_decode.py
