#!/bin/bash
# Session 79: the paired Triton GEMV's launch rule (moe_config.GEMV_PAIRED_DOT2_MAX: 2 K blocks per tl.dot up to 1.55
# pairs per touched expert, Pro the whole range; 2 stages above) against the old one (1 K block, 3 stages) by flags,
# alternating: the Flash MoE call at M = 12-64, Pro's at 16-64, 8 layers' B = 8 / 64 rows.
source bench/runs/lib.sh
C=dsv4.kernels.moe_config
OLD="old:$C.GEMV_PAIRED_DOT2_MAX=0,$C.GEMV_PAIRED_DOT2_MAX_BY_HIDDEN={7168: 0},$C.GEMV_PAIRED_DOT1_STAGES=3"
timeout 200 python3 bench/bench_moe_flags.py --ms 12,16,32,48,64 --graphs 16 "$OLD" "new:" "$OLD" "new:" 2>&1 | grep -v -i warn | tail -7
timeout 200 python3 bench/bench_moe_flags.py --experts pro --ms 16,32,64 --graphs 8 "$OLD" "new:" "$OLD" "new:" 2>&1 | grep -v -i warn | tail -6
rows8 150 8,64 "$C.GEMV_PAIRED_DOT2_MAX=0" "$C.GEMV_PAIRED_DOT1_STAGES=3"
rows8 150 8,64
rows8 150 8,64 "$C.GEMV_PAIRED_DOT2_MAX=0" "$C.GEMV_PAIRED_DOT1_STAGES=3"
rows8 150 8,64
