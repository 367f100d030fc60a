#!/bin/bash
# Session 36 (≈ 1.5 min): where an 8K-token prefill's GPU time goes today -- 4 Flash layers (SWA, SWA, CSA, HCA)
# in one forward with the defaults (Gluon attention, FP8 down GEMM), the profiler's kernel table by GPU time.
source bench/runs/lib.sh
timeout 150 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -vE "^\s*$|Warning|warn" | head -60
