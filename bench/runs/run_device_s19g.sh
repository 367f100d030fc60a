#!/bin/bash
# Session 19, one H200: test_pdl (the static operands now read before the PDL wait), then the decode MoE's
# tensor-core launch shapes at B = 1 (bench/sweep_moe_gemv.py --mma).
source bench/runs/lib.sh
run 150 tests/gpu/test_pdl.py
timeout 240 python3 bench/sweep_moe_gemv.py --tokens 1 --mma 2>&1 | grep -vE "Warning|warn"
