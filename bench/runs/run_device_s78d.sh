#!/bin/bash
# Session 78: the MoE decode measure's misses (s78c, H100, % of copy on the touched codes + scales: M = 1 61.9, 2 71.0,
# 64 73.7) against launch knobs: at M = 48-128 four pairs per program or the wide kernel's 16-token tiles instead of
# two pairs; at M = 1 / 2 the persistent GLU's K ranges, ring depth and the down's ring depth (last swept in session
# 48, before the batched activation load and PDL). Alternating with the default.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F=dsv4.kernels.moe_config
G=dsv4.kernels.moe_glu_decode
timeout 240 python3 bench/bench_moe_flags.py --ms 48,64,96,128 --graphs 16 "default:" "pairs4:$F.GEMV_PAIRS4_FROM=1.3" \
  "wide16:$F.GEMV_PAIRED_MAX=1.0" "default:" "pairs4:$F.GEMV_PAIRS4_FROM=1.3" 2>&1 | grep -v -i warn | tail -6
timeout 240 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "split8:$G.SPLIT=8" \
  "split2:$G.SPLIT=2" "ring8:$G.STAGES=8" "ring4:$G.STAGES=4" "down8:$G.DOWN_STAGES=8" "down4:$G.DOWN_STAGES=4" \
  "default:" 2>&1 | grep -v -i warn | tail -5
