#!/bin/bash
# Prepared in session 19 (not run yet), one H200: the GPU tests session 19 did not reach -- the CUDA-core mHC
# mix at one token vs the dot mix (test_rows_mix_matches_dot_mix, 16 cases), the top-k with its keys loaded once
# (opt-in SINGLE_LOAD), then the rest of test_mhc -- and where a B = 1 decode step's kernel time goes now.
source bench/runs/lib.sh
run 120 tests/gpu/test_mhc.py -k "rows_mix"
run 60 tests/gpu/test_topk.py -k single_load
run 250 tests/gpu/test_mhc.py -k "not rows_mix"
DSV4_PDL=0 timeout 120 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --order 2>&1 | grep -vE "Warning|warn" \
  > $OUT/profile_b1.txt; tail -30 $OUT/profile_b1.txt
