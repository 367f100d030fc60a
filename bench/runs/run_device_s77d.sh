#!/bin/bash
# Session 77, s77a cut to ≈ 240 s (the device budget left after refusals): the ceilings, the Flash MoE call at 8K over
# the GLU codes and launch order 8, the prefill mHC sites chunk by chunk at the site, the GPU tests of both.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep ceilings)
W=dsv4.kernels.moe_wide
timeout 60 python3 bench/bench_moe_flags.py --ms 8192 "default:" "codes:$W.GLU_CODES=True" \
  "gm8:$W.ASYNC_GROUP_M=8" "codes+gm8:$W.GLU_CODES=True,$W.ASYNC_GROUP_M=8" 2>&1 | grep -v -i warn | tail -2
timeout 50 python3 bench/bench_mhc_chunks.py --tokens 8192 --chunks 0,1024,2048 2>&1 | grep -v -i warn | tail -3
run 50 tests/gpu/test_moe_wide.py -k "glu_codes"
run 40 tests/gpu/test_mhc.py -k "prefill_chunks"
