#!/bin/bash
# Session 43 (≈ 6 min): the GPU tests of this session's defaults (norm_rope's early cos / sin at one row per
# program, the decode pool's copies loads-first), then the end-to-end model tests under every default.
source bench/runs/lib.sh
run 150 tests/gpu/test_norm_rope.py tests/gpu/test_cache_store.py
run 210 tests/gpu/test_model_gpu.py
