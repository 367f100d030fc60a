#!/bin/bash
# Session 61: prefill buckets that run out of GPU memory in their capture (the limit drops, those forwards run
# eagerly; new test in test_prefill_pieces_gpu.py, its limits by MiB of room printed). The first version of this call
# also ran tests/gpu/test_engine_gpu.py with the buckets up to 2048 tokens. Carry [".whl"].
source bench/runs/lib.sh
with_llguidance  # (PYTHONPATH: the checkout and llguidance's /tmp/site)
runpar 400 6 -rP tests/gpu/test_prefill_pieces_gpu.py
grep -E "^prefill limit by" $OUT/pytest_par_400.txt
