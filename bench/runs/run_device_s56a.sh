#!/bin/bash
# Prepared in session 55 for session 56 (≈ 6 min with the start): run_device_s55c.sh again -- the structured-output
# GPU test, then bench_structured.py with the apply in fewer launches (host and kernel time apart, at 129,280 tokens
# from the installed packages' sources) -- then the 8-layer B = 1 row as the session's baseline. Carry [".whl"].
# Session 56 added the prefix-snapshot GPU test (default and 4-entry pages: forks sharing the snapshot's pages).
bash bench/runs/run_device_s55c.sh
source bench/runs/lib.sh
export PYTHONPATH=$PWD
# session 56: forks sharing the snapshot's pages (4-entry pages) under graphs and the FP8 cache
timeout 150 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py -k snapshots 2>&1 \
  | tail -4
rows8 100 1 | sed -E 's/MTP draft.*//'
