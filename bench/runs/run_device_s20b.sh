#!/bin/bash
# Prepared in session 19 (not run yet), one H200: three A/Bs prepared offline in session 19.
# 1. the decode MoE at B = 1 with two K blocks per wgmma (dot_blocks 2: half the wgmma waits; 194 registers).
# 2. the mHC finish on 4 / 2 / 1 warps (dsv4.kernels.mhc.FINISH_WARPS; 79 cross-warp barriers at 4 in the SASS).
# 3. the indexer top-k with its keys loaded once (dsv4.kernels.topk.SINGLE_LOAD).
# Adopt what wins, then re-measure the 8-layer rows (rows8 of lib.sh) with it.
source bench/runs/lib.sh
timeout 200 python3 bench/sweep_moe_gemv.py --tokens 1 --mma --dot-blocks 2 2>&1 | grep -vE "Warning|warn"
for w in 4 2 1; do echo "FINISH_WARPS=$w"; timeout 60 python3 bench/flags.py dsv4.kernels.mhc.FINISH_WARPS=$w -- \
  bench/bench_glue.py --tokens 1,8 2>&1 | grep -E "^hc_"; done
timeout 90 python3 bench/bench_glue.py --topk --tokens 1 2>&1 | grep -E "top-k|B="
