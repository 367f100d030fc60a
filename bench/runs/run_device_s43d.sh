#!/bin/bash
# Session 43 (≈ 7 min): the GPU tests of this session's last defaults (norm_rope's early cos / sin at one row per
# program, the decode pool's copies loads-first); where one eager B = 1 step's torch glue kernels come from
# (profile_step --order: 27 torch elementwise / reduce launches, ≈ 45 µs in 4 layers in s43b); then the end-to-end
# model tests under every default (cut by their limit if need be).
source bench/runs/lib.sh
run 120 tests/gpu/test_norm_rope.py tests/gpu/test_cache_store.py
timeout 100 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --order > $OUT/order.txt 2>&1
grep -E "^-- |at::native|aten|Memcpy|Memset|^ +[0-9.]+ +- " $OUT/order.txt | head -60
run 230 tests/gpu/test_model_gpu.py
