#!/bin/bash
# (attention.Q_NORM_IN_WQ_B, fp8_linear(norm=) and tests/gpu/test_linear_norm.py were removed after session 84's run
#  of run_device_s83c.sh: no gain at B = 1 or 8, docs/benchmarks.md "Session 84")
# Session 83's last ≈ 2 min of device time: the fused norm GEMM's GPU test (tests/gpu/test_linear_norm.py: Flash /
# Pro wq_b shapes, the bit-identical share against norm_rope + fp8_linear), then what fits of run_device_s83e.sh.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gate 120 tests/gpu/test_linear_norm.py
rows8 150 1 dsv4.model.attention.Q_NORM_IN_WQ_B=True
