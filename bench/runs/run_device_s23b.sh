#!/bin/bash
# Session 23, one H200: the grid barrier with one polling thread per program; barrier-only and empty-launch costs;
# the chain with the next stage's first weight tile loaded into registers before the barrier (second run: the
# split-K partials summed with unrolled loads); then session 22's prepared checks (run_device_s23c.sh).
source bench/runs/lib.sh
run 120 tests/gpu/test_grid_barrier.py
timeout 200 python3 bench/bench_grid_barrier.py --dims 1024,2048,4096 --stages 8 --per-sm 2,4 2>&1 | tee $OUT/grid_barrier.txt | tail -24
bash bench/runs/run_device_s23c.sh
