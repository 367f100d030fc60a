#!/bin/bash
# Prepared in session 57 for the next session with a device (≈ 6 min with the start): what one cache copy costs at
# Flash's 43 layers (bench_copy_pages.py: host and GPU time of PagedPools.copy_pages, 359 pool tensors, against one
# copy of the same bytes), then session 57's s57a (the H200 B = 1 baseline and the engine's GPU tests). Carry [".whl"].
source bench/runs/lib.sh
timeout 120 python3 bench/bench_copy_pages.py --layers 43 --reps 20 2>&1 | tail -5
bash bench/runs/run_device_s57a.sh
