#!/bin/bash
# Prepared in session 20 (not run yet), one H200: where the ≈ 0.5 ms between a B = 1 decode step (2.2 ms for 8
# layers) and its graph replay (1.41) plus LM head (0.25) goes -- one captured step as a host / GPU timeline.
export PYTHONUNBUFFERED=1
timeout 150 python3 bench/profile_step.py --timeline --layers 8 --batch 1 --ctx 4096 2>&1 | grep -vE "Warning|warn|USDT" | tail -60
timeout 150 python3 bench/profile_step.py --timeline --layers 8 --batch 8 --ctx 4096 2>&1 | grep -vE "Warning|warn|USDT" | tail -40
# The host-computed decode slots (dsv4.engine.paged_decode.HOST_SLOTS, opt-in since session 20): GPU tests of the
# paged step with it on (DSV4_HOST_SLOTS=1), then the 8-layer decode rows off / on (single steps and graph replay).
source bench/runs/lib.sh
DSV4_HOST_SLOTS=1 run 220 tests/gpu/test_model_gpu.py -k "paged or graph"
echo "HOST_SLOTS off:"; rows8 90 1,8
echo "HOST_SLOTS on:"; rows8 90 1,8 dsv4.engine.paged_decode.HOST_SLOTS=True
# The prefill MoE's Gluon kernel (widening overlapped with async wgmma, moe_wide_async) at decode sizes, against
# the decode kernels (whose wgmmas each wait for the one before): ms per routed-MoE call, L2 flushed.
timeout 150 python3 bench/bench_moe_decode_wide.py --ms 1,8,64 2>&1 | grep -vE "Warning|warn"
