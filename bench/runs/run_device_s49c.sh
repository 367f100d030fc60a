#!/bin/bash
# Session 49: ran; CHAINS = 2 measured within the run-to-run spread and was removed in the review (44a88ef has it).
# Prepared in session 48 for session 49 (≈ 2 min): the persistent decode GEMVs with the low / high nibbles' products
# in MMA chains of their own (moe_glu_decode.CHAINS = 2: 8 m64n8k16 MMAs deep instead of 16; is the chain
# latency-bound?) and the down's ring at 12 slots (DOWN_STAGES: its slots now hold its 2 boxes, not the GLU's 4):
# its tests, then the Flash MoE call and the GEMVs alone, chains 1 vs 2. Never run before.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
gate 150 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "chains 2:$G.CHAINS=2" \
  "down on:$G.DOWN_ENABLED=True" "down on, chains 2:$G.DOWN_ENABLED=True,$G.CHAINS=2" \
  "down on, ring 12:$G.DOWN_ENABLED=True,$G.DOWN_STAGES=12" "default again:" 2>&1 | tail -4
timeout 200 python3 bench/flags.py "$G.CHAINS=2" -- bench/bench_moe_stages.py --tokens 1,2,4 2>&1 | tail -13
