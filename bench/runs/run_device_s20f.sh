#!/bin/bash
# Historical: run once (s20f); NORM_EVERY was removed after it (no gain), so its flag rows now fail.
# Session 20, one H200 (last call): the split mHC finish with its RMSNorm in every collapse program
# (dsv4.kernels.mhc.NORM_EVERY) -- its GPU test, the glue timings and the 8-layer B = 1 row, off / on.
source bench/runs/lib.sh
run 110 tests/gpu/test_mhc.py -k norm_in_every
for f in False True; do echo "NORM_EVERY=$f"; timeout 50 python3 bench/flags.py dsv4.kernels.mhc.NORM_EVERY=$f -- \
  bench/bench_glue.py --tokens 1,8 2>&1 | grep -E "^hc_"; done
echo "NORM_EVERY off:"; rows8 85 1
echo "NORM_EVERY on:"; rows8 85 1 dsv4.kernels.mhc.NORM_EVERY=True
