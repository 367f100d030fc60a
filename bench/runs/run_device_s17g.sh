#!/bin/bash
# Session 17, one H200: the CUDA-core decode MoE with split-K (moe_gemv method "cuda"): GPU tests, its launch
# shapes at batch 1 against the tensor-core default, then the 8-layer B = 1 rows with the best shape on / off.
source bench/runs/lib.sh
run 70 tests/gpu/test_moe_gemv_mma.py -k "cuda_moe_split or split_end_to_end or mma_moe_matches_reference"
timeout 75 python3 bench/sweep_moe_gemv.py --tokens 1 2>&1 | grep -vE "Warning|warn" | tee $OUT/sweep_moe.txt | tail -24
best=$(grep "^best:" $OUT/sweep_moe.txt | cut -d' ' -f2)
echo "GEMV_CUDA_MAX_PAIRS=6 shape ($best)"
rows8 80 1 dsv4.kernels.moe_config.GEMV_CUDA_MAX_PAIRS=6 "dsv4.kernels.moe_config.GEMV_CUDA_SHAPE=($best)"
echo "GEMV_CUDA_MAX_PAIRS=0"
rows8 80 1 dsv4.kernels.moe_config.GEMV_CUDA_MAX_PAIRS=0
