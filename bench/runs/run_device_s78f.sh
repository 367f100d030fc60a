#!/bin/bash
# Session 78: which of s78e's variants ended in "unspecified launch failure" -- each in a process of its own, at M = 1
# and 2 (the persistent GLU's ring of R slots shared by two consumer warpgroups that alternate steps: with R odd a slot's
# uses alternate between them, so one can wait on a phase parity the other has not consumed yet).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
for v in "ring3:$G.STAGES=3" "ring5:$G.STAGES=5" "ring4 split2:$G.STAGES=4,$G.SPLIT=2" "down5:$G.DOWN_STAGES=5" \
         "ring3 one consumer:$G.STAGES=3,$G.CONSUMERS=1"; do
  echo "== $v"
  timeout 90 python3 bench/bench_moe_flags.py --ms 1,2 --graphs 16 "default:" "$v" 2>&1 | grep -v -i warn \
    | grep -E "^[0-9]|rror" | tail -3
done
