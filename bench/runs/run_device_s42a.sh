#!/bin/bash
# Prepared in session 41 for session 42, one H200 (≈ 4 min): fresh figures before choosing the next target.
# (1) 8 Flash layers' decode rows at ctx 4K (paged FP8, graphs), B = 1 / 8 / 64 -- not re-measured since session 32;
# (2) where a 4-layer 8K prefill makes the host wait (session 41: layer 0's span 2.4 ms longer than layer 1's, both
# SWA); (3) one eager B = 1 decode step's kernels in launch order (the per-layer chain of #6); (4) below.
source bench/runs/lib.sh
rows8 200 1,8,64
timeout 200 python3 bench/profile_step.py --prefill 8192 --syncs 2>&1 | grep -E "host waits|^ +[0-9]+  |layer [0-9]|forward" \
  | head -24
TOP=30 timeout 150 python3 bench/profile_step.py --order 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -80
# (4) the WS FP8 GLU's stall samples per partition (ncu_source_top.py's segments: producers vs consumers)
KERNEL="_glu_fp8_ws" ncu_src 100 ws42 bench/bench_moe_flags.py --ms 8192 \
  "ws:dsv4.kernels.moe_wide.FP8_GLU=True,dsv4.kernels.moe_glu_fp8.WS_GLU=True" | head -12
