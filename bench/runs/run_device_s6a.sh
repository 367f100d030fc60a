#!/bin/bash
# Session 6, call 1: the graph-node cost with and without programmatic dependent launch, and one
# B = 1 eager step's kernels in launch order (4 Flash layers) to pick the next fusions.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
git checkout -q HEAD -- dsv4 tests  # helpers' unfinished edits stay home
python3 bench/pdl_probe.py --nodes 200 --programs 16
python3 bench/pdl_probe.py --nodes 200 --programs 132 --numel 262144
python3 bench/profile_step.py --layers 4 --order 2>&1 | grep -v Warn > $OUT/order.txt
head -30 $OUT/order.txt; grep -c . $OUT/order.txt
