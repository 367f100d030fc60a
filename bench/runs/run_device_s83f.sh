#!/bin/bash
# Session 83's last ≈ 2 min of device time: the fused norm GEMM's GPU test (tests/gpu/test_linear_norm.py: Flash /
# Pro wq_b shapes, the bit-identical share against norm_rope + fp8_linear), then what fits of run_device_s83e.sh.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
gate 120 tests/gpu/test_linear_norm.py
rows8 150 1 dsv4.model.attention.Q_NORM_IN_WQ_B=True
