#!/bin/bash
# Session 71 (prepared; its first run found the flag cleared by rows that fold, since fixed offline): the fold's flag
# on the GPU (bench/runs/diag_fold.py), then the FP8 scores kernels timed on operands
# folded by the torch reference (sweep --fp4 --ref-fold) after 248K tokens of prefix.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 bench/runs/diag_fold.py 2>&1 | tail -20
for prefix in 253952; do
  timeout 100 python3 bench/sweep_index_scores.py --fp4 --ref-fold --prefix $prefix --shapes 2>&1 | grep -E "keys|default \||gluon|fp8|fold"
done
