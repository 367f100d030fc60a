#!/bin/bash
# Session 75, if device time is left after s75b: (1) the first 8K chunk's kernels beyond the top 25 (s74's "the rest":
# 3.2 ms in 147 launches per 4 layers); (2) the WS FP8 down's ring knobs at 8K (moe_fp8_ws) within 227 KiB of shared
# memory (default 217 KiB; a raw ring of 4 per producer or 7 x slots alone are over, offline): one producer with a
# raw ring of 6, the launch order; 2 weight slots in a process of its own (s40: XSLOTS 8 / WSLOTS 2 faulted).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
TOP=70 timeout 170 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -v -i warn | tail -95
W=dsv4.kernels.moe_fp8_ws
flags() { timeout $1 python3 bench/bench_moe_flags.py --ms 8192 "default:" "${@:2}" 2>&1 | grep -v -i warn | tail -2; }
flags 120 "p1raw6:$W.PRODUCERS=1,$W.RAW={1:6}" "gm8:dsv4.kernels.moe_wide.ASYNC_GROUP_M=8"
flags 60 "x5w2raw5:$W.XSLOTS=5,$W.WSLOTS=2,$W.RAW={2:5}"
