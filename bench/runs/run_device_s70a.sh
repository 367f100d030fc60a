#!/bin/bash
# Session 70: where a first 8K prompt chunk's GPU time goes, kernel by kernel (4 Flash layers SWA, SWA, CSA, HCA),
# then session 69's prepared Nsight run on the radix top-k (run_device_s69h.sh).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 bench/profile_step.py --layers 4 --prefill 8192 --prefix 0 --order > $OUT/prof8k.txt 2>&1
tail -n 150 $OUT/prof8k.txt | cut -c1-160
bash bench/runs/run_device_s69h.sh
