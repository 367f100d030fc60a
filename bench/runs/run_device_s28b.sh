#!/bin/bash
# Session 28, one H200 (≈ 2 min): the Gluon MoE's launch shapes again after session 27's bf16 widening (the
# shared-memory mode of the widened weights was last measured with the f16 widening, session 10).
source bench/runs/lib.sh
timeout 200 python3 bench/bench_moe_wide_shapes.py --ms 8192 --shapes 64,4,reg,4 64,4,smem,4 64,4,smem,3 \
  128,8,smem,4 128,8,reg,4 64,4,reg,3 2>&1 | tail -8
timeout 100 python3 bench/bench_moe_wide_shapes.py --ms 8192 --bm 64 --shapes 64,4,reg,4 64,4,smem,4 128,8,reg,4 \
  128,8,smem,4 2>&1 | tail -6
