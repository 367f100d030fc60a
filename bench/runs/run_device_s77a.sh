#!/bin/bash
# Session 77 (≈ 400 s, most wanted first): the ceilings; session 76's one-warpgroup GLU codes and the bf16 GLU's
# launch order 8 (Flash MoE call at 8K/16K); 8 layers' 8K prefill: default / GLU codes; the prefill mHC sites chunk by
# chunk (mhc.PREFILL_CHUNK, new) at the site and in the 8K prefill; then the GPU tests of both.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep ceilings)
W=dsv4.kernels.moe_wide
timeout 80 python3 bench/bench_moe_flags.py --ms 8192,16384 "default:" "codes:$W.GLU_CODES=True" \
  "gm8:$W.ASYNC_GROUP_M=8" "codes+gm8:$W.GLU_CODES=True,$W.ASYNC_GROUP_M=8" 2>&1 | grep -v -i warn | tail -3
prefill8 70; prefill8 70 $W.GLU_CODES=True
timeout 60 python3 bench/bench_mhc_chunks.py --tokens 8192 --chunks 0,1024,2048 2>&1 | grep -v -i warn | tail -3
prefill8 70 dsv4.kernels.mhc.PREFILL_CHUNK=1024
run 60 tests/gpu/test_moe_wide.py -k "glu_codes"
run 50 tests/gpu/test_mhc.py -k "prefill_chunks"
