#!/bin/bash
# Session 17, one H200: the GEMV for 1-4 rows (MTP verify at batch 1, batches 2-4): kernel tests, the rows
# table against the tensor-core kernels, then 8-layer decode at B = 1, 2, 4 with GEMV_MAX_M = 1 and 4.
source bench/runs/lib.sh
run 120 tests/gpu/test_fp8_gemv.py tests/gpu/test_grouped_w8a16.py -k "gemv or default_config_small or flash_shape"
timeout 60 python3 bench/sweep_gemv.py --models flash --skip-grid --rows 1,2,3,4 2>&1 | grep -E "^flash|copy|rror"
for rows in 4 1; do
  echo "GEMV_MAX_M=$rows"
  rows8 85 1,2,4 dsv4.kernels.linear_config.GEMV_MAX_M=$rows
done
