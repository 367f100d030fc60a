#!/bin/bash
# Session 45 (≈ 7 min): the GLU's gate / up programs at B = 1 by default (no K split) and the router's launch
# quantising x for the routed GLU (`dsv4.model.moe.ROUTER_QUANTISES_X`, off until measured): their GPU tests and
# the MoE / model tests around them; the Flash MoE call with gate / up off / on at 3, 5 and 6 tokens (where the
# rule's threshold goes); the 8-layer rows at B = 1 (twice each, alternating) and B = 4 with the router flag off / on.
source bench/runs/lib.sh
runpar 210 6 tests/gpu/test_router_quant.py tests/gpu/test_router.py tests/gpu/test_moe_gemv_gate_up.py \
  tests/gpu/test_moe_gemv_mma.py tests/gpu/test_model_gpu.py tests/gpu/test_moe.py
for t in 3 5 6; do
  for gu in 0 1; do
    timeout 40 python3 bench/sweep_moe_gemv.py --tokens $t --default-only --gate-up $gu 2>&1 | grep -E "^tokens|rror" | head -2
  done
done
R=dsv4.model.moe.ROUTER_QUANTISES_X
for rep in 1 2; do
  rows8 70 1 $R=False
  rows8 70 1 $R=True
done
rows8 70 4 $R=False
rows8 70 4 $R=True
