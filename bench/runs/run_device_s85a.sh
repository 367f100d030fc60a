#!/bin/bash
# Session 85, one call (≈ 8 min), two opt-ins never run on a GPU yet:
# - the GLU's finish done by the down's consumers (moe_glu_decode.FINISH_IN_DOWN);
# - the one-token GEMV's register cap (linear_config.GEMV_MAXNREG = 104: a shared-expert down GEMV CTA fits beside a
#   persistent GLU CTA).
# 1. their bit-identity tests and the MoE module's other GPU tests (stop if one fails); 2. the MoE call at M = 1 / 2 /
# 4 / 8 in graphs of 16 routings (no shared expert there), default / fold, two rounds; 3. 8 Flash layers' rows,
# B = 1 default / fold / cap twice, B = 8 default / fold (4. below: a time line). Adopt only what wins at B = 1 in both
# rounds and loses nowhere.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
F="dsv4.kernels.moe_glu_decode.FINISH_IN_DOWN=True"
C="dsv4.kernels.linear_config.GEMV_MAXNREG=104"
gate 240 -n 4 tests/gpu/test_moe_glu_decode.py "tests/gpu/test_fp8_gemv.py::test_register_cap_gives_the_same_bits" \
  || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "default:" "fold:$F" "default:" "fold:$F" \
  2>&1 | grep -v -i warn | tail -6
for round in 1 2; do
  rows8 $([ $round = 1 ] && echo 150 || echo 100) 1
  rows8 100 1 $F
  rows8 100 1 $C
done
rows8 100 8; rows8 100 8 $F
# 4. a captured B = 1 step's time line with the register bounds on (session 80's was without): where the shared
# expert's GEMVs and the finish now start against the routed GLU / down ($OUT/timeline_b1.txt comes back)
timeout 150 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline --kernels > $OUT/timeline_b1.txt 2>&1
grep -E "decode step|rror" $OUT/timeline_b1.txt | head -3
