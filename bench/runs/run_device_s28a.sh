#!/bin/bash
# Prepared in session 27, one H200 (≈ 4-5 min): (1) the opt-in TMA loads of the prefill MoE's Gluon kernels
# (moe_wide.GLU_TMA: the weight tiles by TMA; DOWN_TMA: the down GEMM's weight and z tiles, contiguous rows, by TMA;
# one mbarrier per ring slot) -- tests, then the MoE call against the cp.async default. Offline sm_90a SASS had
# more instructions per K block with TMA (GLU 706 vs 610, down 420 vs 358: R2UR / elect / barrier overhead) but
# no per-thread copies and fewer shared loads in the down GEMM, whose s27a stalls were long scoreboard, MIO
# throttle and barrier: only a measurement says. (2) The wide kernel below 16 pairs per expert. (3) Where an 8K
# prefill layer's time goes now (kernels by part, launch order), to pick the next target for #6's 20k tok/s.
source bench/runs/lib.sh
run 200 tests/gpu/test_moe_wide.py -k "tma or gluon_widen"
W=dsv4.kernels.moe_wide
timeout 200 python3 bench/bench_moe_flags.py --ms 2048,4096,8192,16384 "default:" \
  "TMA both:$W.GLU_TMA=True,$W.DOWN_TMA=True" "TMA down:$W.DOWN_TMA=True" "TMA GLU:$W.GLU_TMA=True" 2>&1 | tail -6
C=dsv4.kernels.moe_config
timeout 100 python3 bench/bench_moe_flags.py --ms 256,384,512 "default:" "wide from 4:$C.WIDE64_MIN_PAIRS_PER_EXPERT=4" \
  2>&1 | tail -4
timeout 150 python3 bench/flags.py "dsv4.model.side_stream.OVERLAP=()" -- bench/profile_step.py --layers 4 \
  --prefill 8192 2>&1 | tail -40
