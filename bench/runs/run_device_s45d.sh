#!/bin/bash
# Session 45 (≈ 6 min): s45c's test run was cut at 210 s with no failure; the files it may not have reached, then the
# 8-layer B = 1 rows with the gate / up rule off (GEMV_GATE_UP_MAX_PAIRS = 0: the 2-split one-program GLU, as before
# this session) and on, alternating, and once with the router quantising x as well.
source bench/runs/lib.sh
runpar 170 3 tests/gpu/test_router_quant.py tests/gpu/test_model_gpu.py tests/gpu/test_moe_gemv_gate_up.py
G=dsv4.kernels.moe_config.GEMV_GATE_UP_MAX_PAIRS
rows8 100 1 $G=0
rows8 70 1 $G=8
rows8 70 1 $G=0
rows8 70 1 $G=8
rows8 70 1 $G=8 dsv4.model.moe.ROUTER_QUANTISES_X=True
