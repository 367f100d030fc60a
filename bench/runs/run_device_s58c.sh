#!/bin/bash
# Session 58, for the next session with a device (≈ 6 min with the start): one cache copy at 43 Flash layers, the
# Triton page copy beside its torch reference (same pools, same call); then the whole engine GPU test file (retained
# turns with the near-tie rule, snapshots, shared prompts, structured outputs), which since session 58 queues every
# copy right after the forward that reached its point (the look-ahead no longer waits); then the 8-layer B = 1 row.
# Carry [".whl"].
source bench/runs/lib.sh
with_llguidance
timeout 120 python3 bench/bench_copy_pages.py --layers 43 --reps 20 2>&1 | tail -4
timeout 300 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_engine_gpu.py 2>&1 | tail -12
rows8 100 1 | sed -E 's/MTP draft.*//'
