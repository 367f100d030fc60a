#!/bin/bash
# (attention.Q_NORM_IN_WQ_B, fp8_linear(norm=) and tests/gpu/test_linear_norm.py were removed after session 84's run
#  of run_device_s83c.sh: no gain at B = 1 or 8, docs/benchmarks.md "Session 84")
# Session 83's one short call (≈ 8 min, timings first): 8 Flash layers' B = 1 rows off / decode mHC finish "row" /
# attention.Q_NORM_IN_WQ_B, two rounds; then the fused GEMM's GPU test (tests/gpu/test_linear_norm.py).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
R="dsv4.kernels.mhc.COLLAPSE='row'"
Q=dsv4.model.attention.Q_NORM_IN_WQ_B=True
rows8 150 1
rows8 100 1 $R
rows8 100 1 $Q
rows8 100 1
rows8 100 1 $R
rows8 100 1 $Q
gate 120 tests/gpu/test_linear_norm.py
