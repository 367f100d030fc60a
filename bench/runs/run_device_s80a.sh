#!/bin/bash
# Prepared in session 79 (no device came for s79c): what s79c was to run, then the four-pair launch's knobs.
# 1. the MoE GPU tests after PAIR_BLOCKS' removal and the new down-launch test;
# 2. runs of 8 row tiles per GLU program (opt-in LONG_UNIT_RUN_FROM_PAIRS = 48) in the Flash MoE call at M = 6-11 and
#    in 8 layers' B = 8 rows, alternating -- adopt (set 48 in moe_glu_decode) if both rounds win;
# 3. the M = 1 / 64 measure of #5 with session 79's paired launch;
# 4. four pairs per program (Flash M = 96-128, 64 % of copy): bn 128 on 8 warps, the down's 2 stages.
# 5. Pro's one-pair down with 2 K blocks per dot (below).
# Two calls (each under 600 s): `bash bench/runs/run_device_s80a.sh 1` (1-2, ≈ 450 s), then `... 2` (3-5, ≈ 250 s).
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
NEW="$G.LONG_UNIT_RUN_FROM_PAIRS=48"
if [ "${1:-1}" = 1 ]; then
(cd bench && timeout 40 python3 -c "import bench_engine_step as b; b._ceilings(True)" 2>&1 | grep -v -i warn | tail -2)
runpar 200 8 tests/gpu/test_moe_glu_decode.py tests/gpu/test_moe_gemv_down_launch.py tests/gpu/test_moe_gemv_mma.py \
  tests/gpu/test_moe_gemv_words.py tests/gpu/test_router_quant.py tests/gpu/test_moe_combine.py tests/gpu/test_moe.py
timeout 120 python3 bench/bench_moe_flags.py --ms 6,8,11 --graphs 16 "runs of 1:" "runs of 8:$NEW" "runs of 1:" \
  "runs of 8:$NEW" 2>&1 | grep -v -i warn | tail -5
rows8 100 8
rows8 100 8 $NEW
rows8 100 8
rows8 100 8 $NEW
else
timeout 60 python3 bench/bench_moe_flags.py --ms 1,64 --graphs 16 "default:" "default:" 2>&1 | grep -v -i warn \
  | tail -3
timeout 200 python3 bench/sweep_moe_batch.py --tokens 96,128 --calls 16 --configs "p4:gemv_pairs=4,gemv_unroll=1" \
  "p4 bn128 w8:gemv_pairs=4,gemv_unroll=1,gemv=128,warps1=8" \
  "p4 down s2:gemv_pairs=4,gemv_unroll=1,gemv_down_stages=2" "p4 again:gemv_pairs=4,gemv_unroll=1" 2>&1 \
  | grep -v -i warn
# 5. Pro's one-pair path (M <= 5: the persistent Gluon GLU with 7 K ranges, the Triton down): 2 K blocks per dot in
#    that down (the paired launches gained 4-9 % on Pro from it in session 79)
timeout 150 python3 bench/sweep_moe_batch.py --model pro --tokens 1,2,4 --calls 8 --configs "one:" \
  "one down dot2:gemv_down_dot_blocks=2" "one again:" "one down dot2 again:gemv_down_dot_blocks=2" 2>&1 \
  | grep -v -i warn
# 6. M = 1's fixed costs: every kernel of one captured B = 1 step (4 layers), start / span / stream, into $OUT;
#    the MoE's kernels of the second layer printed here
timeout 150 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline --kernels > $OUT/timeline_b1.txt 2>&1
grep -E "decode step|rror" $OUT/timeline_b1.txt | head -3
awk '/GPU kernels/{on=1} /^host/{on=0} on' $OUT/timeline_b1.txt | sed -n 40,110p
fi
