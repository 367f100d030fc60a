#!/bin/bash
# Session 76, the last ≈ 100 s of device time: the one-warpgroup GLU codes' GPU test (moe_pair_codes) and the Flash
# MoE call at 8K without / with them.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep ceilings)
run 50 tests/gpu/test_moe_wide.py -k glu_codes
timeout 45 python3 bench/bench_moe_flags.py --ms 8192 "default:" "codes:dsv4.kernels.moe_wide.GLU_CODES=True" 2>&1 \
  | grep -v -i warn | tail -2
