#!/bin/bash
# (Session 81 removed moe_glu_decode.CHAIN and its test: kept as the record of what ran; it no longer runs as is.)
# Session 80: the chained persistent decode MoE (moe_glu_decode.CHAIN: GLU, in-kernel finish and down in one launch).
# 1. its GPU test (bit-identity with the three launches, counters, CUDA graph) and the suites of the kernels it
#    reuses (the persistent GLU / down, the method-"mma" GEMV whose epilogue moved into `_swiglu_z`);
# 2. the Flash MoE call at M = 1-11, three launches vs chained, two alternating rounds;
# 3. 8 Flash layers' B = 1 / 8 rows, off / on alternating.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=dsv4.kernels.moe_glu_decode.CHAIN=True
runpar 200 8 tests/gpu/test_moe_glu_down_chain.py tests/gpu/test_moe_glu_decode.py tests/gpu/test_moe_gemv_mma.py
grep -E "FAILED|Error|assert" $OUT/pytest_par_200.txt | head -12
timeout 150 python3 bench/bench_moe_flags.py --ms 1,2,4,8,11 --graphs 16 "three launches:" "chained:$C" \
  "three launches:" "chained:$C" 2>&1 | grep -v -i warn | tail -7
rows8 100 1,8
rows8 100 1,8 $C
rows8 100 1,8
rows8 100 1,8 $C
