#!/bin/bash
# Session 84, one call (≈ 5 min): the persistent down launched with 160 / 152 registers per thread
# (moe_glu_decode.DOWN_MAXNREG, opt-in) instead of Triton's 168 x 384 threads, which fill the SM's register file: with
# room for one of the GLU's finish CTAs beside it, the down's CTAs can start (and their producers fill the 48 KB ring
# of W2 before the PDL wait) while the finish still runs. 1. its bit-identity test (stop if it fails); 2. the MoE
# call at M = 1-8 in graphs of 16 routings, two rounds; 3. 8 Flash layers' B = 1 rows off / 160 alternating.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
G=dsv4.kernels.moe_glu_decode
gate 200 "tests/gpu/test_moe_glu_decode.py::test_down_register_bound_gives_the_same_bits" || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4,8 --graphs 16 "default:" "bound 160:$G.DOWN_MAXNREG=160" \
  "bound 152:$G.DOWN_MAXNREG=152" "default:" "bound 160:$G.DOWN_MAXNREG=160" "bound 152:$G.DOWN_MAXNREG=152" 2>&1 \
  | grep -v -i warn | tail -6
rows8 150 1
rows8 100 1 $G.DOWN_MAXNREG=160
rows8 100 1
rows8 100 1 $G.DOWN_MAXNREG=160
