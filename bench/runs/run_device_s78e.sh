#!/bin/bash
# Session 78: s78d's two small wins at M = 1 / 2 / 4 (the persistent GLU's ring of 4 slots instead of 6: -2.3 / -2.4 /
# -1.2 %; 2 K ranges instead of 4: -0.9 / -2.1 / -2.1 %) together and around, alternating with the default; then the
# 8-layer B = 1 rows, default and the best, twice each in alternation.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "default:" "ring4:$G.STAGES=4" \
  "ring4 split2:$G.STAGES=4,$G.SPLIT=2" "ring3:$G.STAGES=3" "ring5:$G.STAGES=5" "ring3 split2:$G.STAGES=3,$G.SPLIT=2" \
  "default:" "ring4:$G.STAGES=4" "ring4 split2:$G.STAGES=4,$G.SPLIT=2" 2>&1 | grep -v -i warn | tail -6
B=${BEST:-$G.STAGES=4}
rows8 100 1
rows8 100 1 $B
rows8 100 1
rows8 100 1 $B
