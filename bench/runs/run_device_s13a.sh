#!/bin/bash
# Session 13, first call: the GPU tests of session 12's last (CPU-only checked) changes; the decode-sized
# FP8 linear launch-shape sweep (bench/sweep_linear.py, Flash shapes).
source bench/runs/lib.sh
run 200 tests/gpu/test_model_gpu.py tests/gpu/test_fp8_linear.py tests/gpu/test_moe_wide.py -k "model or grouped or cublas or requant or dequantized"
timeout 330 python3 bench/sweep_linear.py --models flash --ms 1,8,64,128 --out $OUT > $OUT/sweep.txt 2>&1
cat $OUT/sweep.txt | grep -v "^  failed" | tail -40; grep -c "failed" $OUT/sweep.txt
