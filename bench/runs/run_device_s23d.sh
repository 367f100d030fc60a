#!/bin/bash
# Session 23, one H200: is the launch chain's extra time at 16.8 MB per stage PDL's early weight prefetch? The same
# chains with PDL on (default) and off (DSV4_PDL=0: no griddepcontrol, no prefetch before the wait).
source bench/runs/lib.sh
for pdl in 1 0; do
  echo "DSV4_PDL=$pdl"
  DSV4_PDL=$pdl timeout 120 python3 bench/bench_grid_barrier.py --dims 1024,4096 --stages 8 --per-sm 4 2>&1 | grep -E "^(1024|4096) |rror"
done
