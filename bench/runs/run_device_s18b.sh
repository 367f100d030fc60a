#!/bin/bash
# Session 18, one H200: two pairs of one expert per decode-MoE program (dsv4.kernels.moe_gemv_pairs): GPU tests,
# the batch sweep against one pair per program and the default, then 8 layers at B = 16 / 32 / 64 with it on / off.
source bench/runs/lib.sh
run 90 tests/gpu/test_moe_gemv_mma.py
timeout 170 python3 bench/sweep_moe_batch.py --tokens 8,16,32,48,64,96,128 2>&1 | grep -vE "Warning|warn" | tee $OUT/sweep_moe_batch.txt
echo "two pairs from 1.15 to 2.6 pairs per touched expert"
rows8 150 16,32,64 dsv4.kernels.moe_config.GEMV_PAIRED_FROM=1.15 dsv4.kernels.moe_config.GEMV_PAIRED_MAX=2.6
echo "default"
rows8 150 16,32,64
