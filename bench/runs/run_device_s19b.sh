#!/bin/bash
# Session 19, one H200: the GPU tests on session 18's review commit (ab3afb9: _column_pairs, one BLK load), then
# where one B = 1 decode step's kernel time goes now (eager, PDL off so that each kernel's time is its own).
source bench/runs/lib.sh
run 240 tests/gpu/test_model_gpu.py
run 170 tests/gpu/test_moe_gemv_mma.py
DSV4_PDL=0 timeout 120 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --order 2>&1 | grep -vE "Warning|warn" \
  > $OUT/profile_b1.txt; head -60 $OUT/profile_b1.txt
