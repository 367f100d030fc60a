#!/bin/bash
# Prepared in session 45 for session 46 (≈ 7 min). s45c / s45d's timings ran beside a timed-out test run's xdist
# workers (since fixed in `runpar`), so the two session-45 decode items are measured again on a quiet GPU, rows first:
# the 8-layer B = 1 rows with moe_config.GEMV_GATE_UP_MAX_PAIRS 0 (off, the default) / 8 and with
# moe.ROUTER_QUANTISES_X off / on, alternating twice; then the tests s45c / s45d cut (the model's, the router's).
source bench/runs/lib.sh
G=dsv4.kernels.moe_config.GEMV_GATE_UP_MAX_PAIRS
R=dsv4.model.moe.ROUTER_QUANTISES_X
rows8 120 1 $G=0  # (first: compiles)
for rep in 1 2; do
  rows8 70 1 $G=8
  rows8 70 1 $G=0
  rows8 70 1 $R=True
  rows8 70 1 $R=False
done
for t in 1 3; do
  for g in 0 8; do
    timeout 40 python3 bench/flags.py $G=$g -- bench/sweep_moe_gemv.py --tokens $t --default-only 2>&1 \
      | grep -E "^tokens|rror" | head -2
  done
done
runpar 200 3 tests/gpu/test_router_quant.py tests/gpu/test_model_gpu.py tests/gpu/test_moe_gemv_gate_up.py
