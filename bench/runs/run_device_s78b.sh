#!/bin/bash
# Session 78: is the paired Triton GEMV (moe_config.GEMV_PAIRED_FROM = 1.08 pairs per touched expert, set in session
# 18) still the better path from M = 8 tokens, now that the one-pair path is the persistent Gluon GLU / down (session
# 47-49)? The Flash MoE call at M = 8..64 in CUDA graphs of 16 routings, default against the one-pair path forced
# (both bounds raised), alternating; then the 8-layer rows at B = 8 / 64 with and without. Ceilings first.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && timeout 60 python3 -c "import bench_engine_step as b; b._ceilings(True)") 2>&1 | grep -v -i warn | tail -3
F=dsv4.kernels.moe_config
ONE="$F.GEMV_PAIRED_FROM=99,$F.GEMV_MAX_PAIRS_PER_EXPERT=99"
timeout 300 python3 bench/bench_moe_flags.py --ms ${MS:-8,12,16,24,32,48,64} --graphs 16 "default:" "one_pair:$ONE" \
  "default:" "one_pair:$ONE" 2>&1 | grep -v -i warn | tail -12
rows8 150 8,64
rows8 150 8,64 $F.GEMV_PAIRED_FROM=99 $F.GEMV_MAX_PAIRS_PER_EXPERT=99
