#!/bin/bash
# Session 11, final: the GPU tests of the session's default (the GLU on one warpgroup) -- the MoE kernels and the
# model end to end -- then the host's side of eager decode steps at ctx 8192 vs 1024 (s11c/s11d: 22.9 ms per
# eager step at 8K for ~2.3 ms of GPU time; captured steps 1.28 ms).
source "$(dirname "$0")/lib.sh"
run 100 tests/gpu/test_moe_wide.py
run 250 tests/gpu/test_model_gpu.py
for ctx in 8192 1024; do
timeout 90 python3 bench/profile_step.py --layers 4 --ctx $ctx --host --eager 2>&1 | grep -v Warn | head -34
done
