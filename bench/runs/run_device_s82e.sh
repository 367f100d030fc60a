#!/bin/bash
# (moe_glu_decode.DOWN_CHAINS / GLU_CHAINS were removed after session 84's run of run_device_s83b.sh: within 0.5 %,
#  docs/benchmarks.md "Session 84")
# Prepared in session 82 (offline only), one call (≈ 7 min): a step's two K blocks on MMA chains of their own in the
# persistent decode GLU / down (moe_glu_decode.GLU_CHAINS / DOWN_CHAINS, opt-in; the same outputs).
# 1. the decode GLU / down file (its new test: equal outputs with either flag and both) -- stop if it fails;
# 2. the Flash MoE call at M = 1-8 in graphs of 16 routings: one chain / down chains / GLU chains / both, two
#    alternating rounds -- adopt a flag only if it wins at M = 1 in both rounds and loses nowhere;
# 3. 8 Flash layers' B = 1 / 8 rows, off / both alternating.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
D=$G.DOWN_CHAINS=True
B=$G.GLU_CHAINS=True
gate 200 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "one chain:" "down chains:$D" "glu chains:$B" \
  "both:$D,$B" "one chain:" "down chains:$D" "glu chains:$B" "both:$D,$B" 2>&1 | grep -v -i warn | tail -10
rows8 150 1,8
rows8 100 1,8 $D $B
rows8 100 1,8
rows8 100 1,8 $D $B
