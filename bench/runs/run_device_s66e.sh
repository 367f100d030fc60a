#!/bin/bash
# Session 66 (≈ 2 min with the start): the per-pair kernels' upper bound (GEMV_PAIRED_MAX = 4 pairs per touched
# expert) against the wide kernel's 16-token tiles, Flash M = 128-176 and Pro M = 128-224, twice each (Pro M = 192
# favoured the tiles by 3 % once in s66b). µs per MoE call of 8 routings in one CUDA graph.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=dsv4.kernels.moe_config
W="wide16:$C.GEMV_PAIRED_MAX=0,$C.GEMV_MAX_PAIRS_PER_EXPERT=0"
for r in 1 2; do
  timeout 60 python3 bench/bench_moe_flags.py --ms 128,144,160,176 --graphs 8 "default:" "$W" 2>&1 | grep -v -i warn \
    | tail -5
  timeout 80 python3 bench/bench_moe_flags.py --experts pro --ms 128,160,192,224 --graphs 8 "default:" "$W" 2>&1 \
    | grep -v -i warn | tail -5
done
