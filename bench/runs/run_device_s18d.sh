#!/bin/bash
# Session 18, one H200, final tree: the model-level GPU tests with two pairs per decode-MoE program by default
# (B = 8 .. 96 on Flash), then 8 layers at B = 8 / 64 / 96 with the new default and with the session-17 rule.
source bench/runs/lib.sh
run 200 tests/gpu/test_model_gpu.py
echo "default (two pairs per program from 1.08 to 2.7 pairs per touched expert)"
rows8 170 8,64,96
echo "session 17 rule (one pair per program up to 1.45, per-group kernel beyond)"
rows8 170 8,64,96 dsv4.kernels.moe_config.GEMV_PAIRED_FROM=1e9
