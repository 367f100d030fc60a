#!/bin/bash
# Session 24, one H200: (1) the kernels of one eager B = 1 decode step on the current tree, in launch order per
# layer (4 layers: sliding, sliding, CSA, HCA; profile_step.py --order), for the next fusion candidates; (2) is the
# "dot" chain's error (s24a: 0.17 / 0.26 / 1.3 after 8 stages) the FP8 MMA's own summation carried through the
# requantisations, or a race? The same chain with 1 and 2 stages.
source bench/runs/lib.sh
timeout 150 python3 bench/profile_step.py --layers 4 --order 2>&1 | tail -120 > $OUT/order.txt; tail -75 $OUT/order.txt
for s in 1 2; do
  timeout 60 python3 bench/bench_grid_barrier.py --dims 1024,2048 --stages $s --per-sm 4 2>&1 | grep -E "^(1024|2048) "
done
