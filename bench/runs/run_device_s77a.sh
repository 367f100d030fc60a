#!/bin/bash
# Session 77: session 76's s76b (the one-warpgroup GLU codes' GPU test, the Flash MoE call A/B over codes and launch
# order 8 at 4K/8K/16K, 8 layers' 8K prefill without / with the codes), the ceilings of the same run, and which parts
# launch the prefill's torch elementwise kernels (s75c: 332 µs in 5 launches of elementwise_kernel<128, 4>).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep ceilings)
run 80 tests/gpu/test_moe_wide.py -k "glu_codes"
W=dsv4.kernels.moe_wide
timeout 120 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "codes:$W.GLU_CODES=True" \
  "gm8:$W.ASYNC_GROUP_M=8" "codes+gm8:$W.GLU_CODES=True,$W.ASYNC_GROUP_M=8" 2>&1 | grep -v -i warn | tail -4
prefill8 90; prefill8 90 $W.GLU_CODES=True
timeout 100 python3 bench/profile_step.py --layers 4 --prefill 8192 --order 2>&1 | grep -v -i warn \
  | grep -E "^-- |order:|elementwise_kernel<128, 4>|elementwise_kernel<128, 2>|index_elementwise" | head -30
