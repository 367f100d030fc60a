#!/bin/bash
# Session 76, s76a cut to what the remaining device time fits: the one-warpgroup GLU codes' GPU test
# (moe_pair_codes), the Flash MoE call A/B (codes, launch order 8) and 8 layers' 8K prefill without / with the codes.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 80 tests/gpu/test_moe_wide.py -k "glu_codes"
W=dsv4.kernels.moe_wide
timeout 120 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "codes:$W.GLU_CODES=True" \
  "gm8:$W.ASYNC_GROUP_M=8" "codes+gm8:$W.GLU_CODES=True,$W.ASYNC_GROUP_M=8" 2>&1 | grep -v -i warn | tail -4
prefill8 90; prefill8 90 $W.GLU_CODES=True
