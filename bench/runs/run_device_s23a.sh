#!/bin/bash
# Session 23, one H200: the grid barrier's GPU test, then what a stage boundary costs (launch vs grid barrier).
source bench/runs/lib.sh
run 120 tests/gpu/test_grid_barrier.py
timeout 300 python3 bench/bench_grid_barrier.py --dims 1024,2048,4096 --stages 8 2>&1 | tee $OUT/grid_barrier.txt | tail -20
