#!/bin/bash
# Historical: run once (s20d) on the scalar Sinkhorn, reverted after it; on later trees it times the current finish.
# Session 20, one H200: the mHC Sinkhorn on per-thread scalars (dsv4/kernels/mhc_kernels.py `_post_comb`) -- its
# GPU tests, the glue timings (compare s20b's hc_ rows: FINISH_WARPS=4 is the default) and the 8-layer rows
# (s20c's "prefetch off" rows are the baseline: 1.41 / 3.25 ms) -- and the two-pass greedy pick.
source bench/runs/lib.sh
run 60 tests/gpu/test_sampler_gpu.py
timeout 60 python3 bench/bench_glue.py --tokens 1,8 --argmax 2>&1 | grep -E "^hc_|B=|greedy"
run 280 tests/gpu/test_mhc.py
rows8 90 1,8
