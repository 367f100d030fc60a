#!/bin/bash
# Session 61: a prefill bucket that runs out of GPU memory in its capture (the limit drops, those forwards run
# eagerly; new test in test_prefill_pieces_gpu.py), and the engine's GPU tests with the buckets up to 2048 tokens.
# Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 400 6 -rP tests/gpu/test_prefill_pieces_gpu.py tests/gpu/test_engine_gpu.py
grep -E "^captured" $OUT/pytest_par_400.txt
