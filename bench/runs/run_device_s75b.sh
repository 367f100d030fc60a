#!/bin/bash
# Session 75: (1) the first 8K chunk's kernels beyond the top 25 (s74's "the rest": 3.2 ms in 147 launches per 4
# layers); (2) the WS FP8 down's ring knobs at 8K (moe_fp8_ws: x / weight slots, one producer), the GLU unchanged.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TOP=70 timeout 300 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -v -i warn | tail -95
W=dsv4.kernels.moe_fp8_ws
timeout 250 python3 bench/bench_moe_flags.py --ms 8192 "default:" "x7w3:$W.XSLOTS=7" "x5w2:$W.XSLOTS=5,$W.WSLOTS=2" \
  "x6w2:$W.WSLOTS=2" "p1:$W.PRODUCERS=1" "gm8:dsv4.kernels.moe_wide.ASYNC_GROUP_M=8" 2>&1 | grep -v -i warn | tail -3
