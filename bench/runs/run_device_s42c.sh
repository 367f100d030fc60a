#!/bin/bash
# Session 42 (≈ 5 min): moe_gemv.SCALES_AHEAD (one pair per program: the next loop step's scale bytes loaded a
# step ahead) -- GPU tests, the Flash MoE call at M = 1 / 4 in CUDA graphs (ahead vs inline, twice), the
# 8-layer decode rows at B = 1 with it off / on.
# (SCALES_AHEAD was removed after this run: slower, and bits differed from the paired launches; docs/benchmarks.md.)
source bench/runs/lib.sh
run 300 tests/gpu/test_moe_gemv_words.py tests/gpu/test_moe_gemv_mma.py
F=dsv4.kernels.moe_gemv.SCALES_AHEAD
timeout 200 python3 bench/bench_moe_flags.py --ms 1,4 --graphs 8 "ahead:" "inline:$F=False" "ahead2:" \
  "inline2:$F=False" 2>&1 | grep -vE "Warning|warn" | tail -8
rows8 200 1 $F=False
rows8 200 1 $F=True
