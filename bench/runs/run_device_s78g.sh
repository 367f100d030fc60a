#!/bin/bash
# Session 78: s78f's "ring4 split2" (the persistent GLU with 4 ring slots and 2 K ranges instead of 6 and 4: M = 1
# 42.9 -> 40.8 µs, M = 2 72.7 -> 69.6) across the one-pair range (M <= 11 since this session), alternating with the
# default and split 2 alone; then 8 Flash layers' B = 1 / 8 rows, default and ring4 split2, twice in alternation.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
timeout 150 python3 bench/bench_moe_flags.py --ms 1,2,4,8,11 --graphs 16 "default:" "ring4 split2:$G.STAGES=4,$G.SPLIT=2" \
  "split2:$G.SPLIT=2" "default:" "ring4 split2:$G.STAGES=4,$G.SPLIT=2" 2>&1 | grep -v -i warn | tail -7
rows8 100 1,8
rows8 100 1,8 $G.STAGES=4 $G.SPLIT=2
rows8 100 1,8
rows8 100 1,8 $G.STAGES=4 $G.SPLIT=2
