#!/bin/bash
# Session 18, one H200 (≈ 300 s left): 8 layers at B = 96 / 128 with the final rule (four pairs per program at one
# K block per step from 2.3 pairs per touched expert, up to 4.0) against s18d's rule (two pairs up to 2.7).
source bench/runs/lib.sh
echo "final rule"
rows8 100 96,128
echo "s18d rule"
rows8 100 96,128 dsv4.kernels.moe_config.GEMV_PAIRS4_FROM=1e9 dsv4.kernels.moe_config.GEMV_PAIRED_MAX=2.7
