#!/bin/bash
# Session 21, one H200, the final tree: the top-k without its opt-in single-load variant, the model's GPU tests
# (host slots by default, the engine's overlap), the sampler's.
source bench/runs/lib.sh
run 80 tests/gpu/test_topk.py
run 300 tests/gpu/test_model_gpu.py tests/gpu/test_sampler_gpu.py
