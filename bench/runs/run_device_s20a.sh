#!/bin/bash
# Prepared in session 19 (not run yet), one H200: the GPU cases of test_mhc that session 19's last call did not
# reach (the CUDA-core mix at one token vs the dot mix: test_rows_mix_matches_dot_mix, 16 cases; then the rest of
# test_mhc), and where a B = 1 decode step's kernel time goes after session 19 (eager, PDL off).
source bench/runs/lib.sh
run 120 tests/gpu/test_mhc.py -k "rows_mix"
run 300 tests/gpu/test_mhc.py -k "not rows_mix"
DSV4_PDL=0 timeout 120 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --order 2>&1 | grep -vE "Warning|warn" \
  > $OUT/profile_b1.txt; tail -30 $OUT/profile_b1.txt
# the decode MoE at B = 1 with two K blocks per wgmma (dot_blocks 2: half the wgmma waits, 194 registers offline)
timeout 200 python3 bench/sweep_moe_gemv.py --tokens 1 --mma --dot-blocks 2 2>&1 | grep -vE "Warning|warn"
# the mHC finish on 1 / 2 / 4 warps (dsv4.kernels.mhc.FINISH_WARPS; the Sinkhorn's cross-warp barriers at 4)
for w in 4 2 1; do echo "FINISH_WARPS=$w"; timeout 60 python3 bench/flags.py dsv4.kernels.mhc.FINISH_WARPS=$w -- \
  bench/bench_glue.py --tokens 1,8 2>&1 | grep -E "^hc_"; done
# the indexer top-k with its keys loaded once (dsv4.kernels.topk.SINGLE_LOAD; its GPU test first)
run 60 tests/gpu/test_topk.py -k single_load
timeout 60 python3 bench/bench_glue.py --topk --tokens 1 2>&1 | grep -E "top-k|B="
