#!/bin/bash
# Session 84, one call (≈ 8 min; timings after a short gate): the persistent decode MoE kernels under register bounds
# (moe_glu_decode.GLU_BOUND / DOWN_BOUND = (maxnreg, second consumer's registers), opt-in) instead of Triton's
# 168 x 384 threads, which fill the SM's register file so that no other CTA fits beside them: the down at (160, 200)
# leaves room for one of the GLU's finish CTAs (its ring can fill during the finish), at (128, 136) for one of the
# shared expert's down GEMV CTAs; the GLU at (136, 184) for two of its w13 GEMV CTAs.
# 1. the bit-identity test (stop if it fails); 2. the MoE call at M = 1-4 in graphs of 16 routings (no shared expert
# there: the finish's effect alone), two rounds; 3. 8 Flash layers' B = 1 rows (the shared expert beside), default /
# down 160 / both bounds (down 128, GLU 136) / the shared expert inline (a control: session 12 put it beside, before
# the persistent MoE kernels existed; session 80's time line has its SwiGLU and down GEMV starting only as the GLU's
# CTAs exit and overlapping the routed down's start), two rounds. Adopt only what wins at B = 1 in both rounds.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
D1="$G.DOWN_BOUND=(160,200)"
D2="$G.DOWN_BOUND=(128,136)"
G2="$G.GLU_BOUND=(136,184)"
INLINE="dsv4.model.side_stream.OVERLAP=('projections','indexer','step_tables')"
gate 200 "tests/gpu/test_moe_glu_decode.py::test_register_bound_gives_the_same_bits" || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "down 160:$D1" "down 128:$D2" \
  "both:$D2,$G2" "default:" "down 160:$D1" "down 128:$D2" "both:$D2,$G2" 2>&1 | grep -v -i warn | tail -6
for round in 1 2; do
  rows8 $([ $round = 1 ] && echo 150 || echo 100) 1
  rows8 100 1 $D1
  rows8 100 1 $D2 $G2
  rows8 100 1 "$INLINE"
done
