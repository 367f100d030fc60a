#!/bin/bash
# Session 78: #5's MoE decode measure over M = 1..64 (the Flash MoE call in CUDA graphs of 16 routings, the expert
# bytes each routing touches -- codes and scales of its distinct experts -- and their share of the copy bandwidth
# of the same run), and where the one-pair persistent Gluon path should stop (s78b: it won at M = 8, lost from 12):
# default against the one-pair path forced, alternating, at M = 8..12.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
(cd bench && timeout 60 python3 -c "import bench_engine_step as b; b._ceilings(True)") 2>&1 | grep -v -i warn | tail -3
F=dsv4.kernels.moe_config
ONE="$F.GEMV_PAIRED_FROM=99,$F.GEMV_MAX_PAIRS_PER_EXPERT=99"
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4,8,16,32,64 --graphs 16 "default:" 2>&1 | grep -v -i warn | tail -9
timeout 200 python3 bench/bench_moe_flags.py --ms 8,9,10,11,12 --graphs 16 "default:" "one_pair:$ONE" "default:" \
  "one_pair:$ONE" 2>&1 | grep -v -i warn | tail -7
