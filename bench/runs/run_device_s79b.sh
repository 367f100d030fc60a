source bench/runs/lib.sh
C=dsv4.kernels.moe_config
OLD="old:$C.GEMV_PAIRED_DOT2_MAX=0,$C.GEMV_PAIRED_DOT2_MAX_BY_HIDDEN={7168: 0},$C.GEMV_PAIRED_DOT1_STAGES=3"
timeout 200 python3 bench/bench_moe_flags.py --ms 12,16,32,48,64 --graphs 16 "$OLD" "new:" "$OLD" "new:" 2>&1 | grep -v -i warn | tail -7
timeout 200 python3 bench/bench_moe_flags.py --experts pro --ms 16,32,64 --graphs 8 "$OLD" "new:" "$OLD" "new:" 2>&1 | grep -v -i warn | tail -6
rows8 150 8,64 "$C.GEMV_PAIRED_DOT2_MAX=0" "$C.GEMV_PAIRED_DOT1_STAGES=3"
rows8 150 8,64
rows8 150 8,64 "$C.GEMV_PAIRED_DOT2_MAX=0" "$C.GEMV_PAIRED_DOT1_STAGES=3"
rows8 150 8,64
