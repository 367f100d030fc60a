#!/bin/bash
# Session 41 (≈ 2 min): where a 4-layer 8K prefill's GPU time goes today (top 45 kernels, parts, layer spans).
source bench/runs/lib.sh
TOP=45 timeout 300 python3 bench/profile_step.py --prefill 8192 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -75
