#!/bin/bash
# Session 27, one H200 (given inline to the device tool, kept here): the opt-in TMA loads of the prefill MoE's Gluon
# kernels (weight tiles, and the down GEMM's z tiles, by TMA on one mbarrier per ring slot; register loop only), as
# committed in c085b9c and reverted after this run: its tests (cut by the 90 s limit, no failure) and the MoE call.
# Measured: M = 4096 default 3.816, TMA both 3.982, TMA down 3.813; M = 8192 6.822, 7.183, 6.956 ms (outputs
# bit-identical). No gain: removed.
source bench/runs/lib.sh; run 90 tests/gpu/test_moe_wide.py -k "tma"; W=dsv4.kernels.moe_wide
timeout 80 python3 bench/bench_moe_flags.py --ms 4096,8192 "default:" "TMA both:$W.GLU_TMA=True,$W.DOWN_TMA=True" \
  "TMA down:$W.DOWN_TMA=True" 2>&1 | tail -3
