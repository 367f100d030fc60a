#!/bin/bash
# Prepared in session 20 (not run yet), one H200.
# 1. Where the ≈ 0.5 ms between a B = 1 decode step (2.2 ms for 8 layers) and its graph replay (1.41) plus LM head
#    (0.25) goes: one captured step as a host / GPU timeline (B = 1 and 8).
# 2. The prefill MoE's Gluon kernel (widening overlapped with async wgmma, moe_wide_async) forced at decode sizes,
#    against the decode kernels (whose wgmmas each wait for the one before): ms per routed-MoE call, L2 flushed.
export PYTHONUNBUFFERED=1
timeout 150 python3 bench/profile_step.py --timeline --layers 8 --batch 1 --ctx 4096 2>&1 | grep -vE "Warning|warn|USDT" | tail -60
timeout 150 python3 bench/profile_step.py --timeline --layers 8 --batch 8 --ctx 4096 2>&1 | grep -vE "Warning|warn|USDT" | tail -40
timeout 150 python3 bench/bench_moe_decode_wide.py --ms 1,8,64 2>&1 | grep -vE "Warning|warn"
