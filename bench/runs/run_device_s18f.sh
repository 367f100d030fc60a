#!/bin/bash
# Session 18, one H200 (≈ 400 s left): blocks of pairs at one K block per loop step (4 MMA columns per pair, so 4
# pairs fit 16 columns): GPU tests, the Flash sweep where the per-group kernel still runs (B >= 128) and at B = 64
# / 96, then Pro experts at B = 16 / 64 (the two-pairs rule was applied to Pro unmeasured).
source bench/runs/lib.sh
run 60 tests/gpu/test_moe_gemv_mma.py -k "pair"
timeout 130 python3 bench/sweep_moe_batch.py --tokens 64,96,128,192,256 --calls 6 2>&1 | grep -vE "Warning|warn"
timeout 110 python3 bench/sweep_moe_batch.py --model pro --tokens 16,64 --calls 4 2>&1 | grep -vE "Warning|warn"
