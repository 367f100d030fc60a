#!/bin/bash
# Session 18, one H200: blocks of two or four pairs of one expert per decode-MoE program (sorted pairing kernel):
# GPU tests, the batch sweep, then 8 layers at B = 64 / 128 with four pairs from 1.5 per touched expert up to 3.5
# against the default (two pairs up to 2.3, the per-group kernel beyond).
source bench/runs/lib.sh
run 100 tests/gpu/test_moe_gemv_mma.py
timeout 200 python3 bench/sweep_moe_batch.py --tokens 16,32,64,96,128 2>&1 | grep -vE "Warning|warn" | tee $OUT/sweep_moe_batch.txt
echo "four pairs from 1.5 to 3.5 pairs per touched expert"
rows8 130 64,128 dsv4.kernels.moe_config.GEMV_PAIRS4_FROM=1.5 dsv4.kernels.moe_config.GEMV_PAIRED_MAX=3.5
echo "default"
rows8 130 64,128
