#!/bin/bash
# Session 79: after removing PAIR_BLOCKS (the persistent GLU / down with blocks of two pairs) and adding runs of 8 row
# tiles per GLU program from 48 pairs (opt-in, moe_glu_decode.LONG_UNIT_RUN_FROM_PAIRS = 48): the MoE GPU tests (the new
# test_moe_gemv_down_launch.py), the Flash MoE call at M = 6-11 without / with the runs, 8 layers' B = 8 rows the
# same, and the M = 1 / 64 measure. Trimmed to fit ≈ 360 s after four failed starts.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
runpar 170 8 tests/gpu/test_moe_glu_decode.py tests/gpu/test_moe_gemv_down_launch.py tests/gpu/test_moe_gemv_mma.py
G=dsv4.kernels.moe_glu_decode
NEW="$G.LONG_UNIT_RUN_FROM_PAIRS=48"
timeout 100 python3 bench/bench_moe_flags.py --ms 6,8,11 --graphs 16 "runs of 1:" "runs of 8:$NEW" "runs of 1:" \
  "runs of 8:$NEW" 2>&1 | grep -v -i warn | tail -5
rows8 100 8
rows8 100 8 $NEW
timeout 60 python3 bench/bench_moe_flags.py --ms 1,64 --graphs 16 "default:" "default:" 2>&1 | grep -v -i warn \
  | tail -3
(cd bench && timeout 40 python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep -v -i warn | tail -2)
