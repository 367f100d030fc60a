#!/bin/bash
# Session 77: the ceilings; session 76's one-warpgroup GLU codes (GPU test, Flash MoE call A/B over codes and launch
# order 8 at 4K/8K/16K); the prefill mHC sites chunk by chunk (mhc.PREFILL_CHUNK, new) at the site; 8 layers' 8K
# prefill: default / GLU codes / mHC chunks of 1024.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep ceilings)
run 70 tests/gpu/test_moe_wide.py -k "glu_codes"
W=dsv4.kernels.moe_wide
timeout 110 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "codes:$W.GLU_CODES=True" \
  "gm8:$W.ASYNC_GROUP_M=8" "codes+gm8:$W.GLU_CODES=True,$W.ASYNC_GROUP_M=8" 2>&1 | grep -v -i warn | tail -4
run 60 tests/gpu/test_mhc.py -k "prefill_chunks"
timeout 80 python3 bench/bench_mhc_chunks.py 2>&1 | grep -v -i warn | tail -5
prefill8 80; prefill8 80 $W.GLU_CODES=True; prefill8 80 dsv4.kernels.mhc.PREFILL_CHUNK=1024
