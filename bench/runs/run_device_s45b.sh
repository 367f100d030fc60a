#!/bin/bash
# Prepared in session 44 for session 45 (≈ 9 min): moe_gemv.GLU_GATE_UP_PROGRAMS (prepared without a GPU: the decode
# GLU's gate and up rows in programs of their own -- offline, 150 -> 95 registers and 61 -> 42 KB of shared memory,
# so 5 CTAs per SM instead of 3). Its GPU bit tests; the Flash MoE call (GLU + down, µs in a graph) off / on at 1, 2
# and 4 tokens (one pair per program there); the tensor-core sweep with it on at 1 token (split 1 should now fit in
# one wave: 384 programs for 660 slots); the 8-layer B = 1 rows off / on. Default where it wins, else remove it.
source bench/runs/lib.sh
F=dsv4.kernels.moe_gemv.GLU_GATE_UP_PROGRAMS
run 100 tests/gpu/test_moe_gemv_gate_up.py tests/gpu/test_moe_gemv_words.py
for t in 1 2 4; do
  for on in False True; do
    echo "== tokens $t GU $on"
    timeout 60 python3 bench/flags.py $F=$on -- bench/sweep_moe_gemv.py --tokens $t --default-only 2>&1 \
      | grep -E "tokens|rror" | head -2
  done
done
timeout 220 python3 bench/flags.py $F=True -- bench/sweep_moe_gemv.py --tokens 1 --mma --dot-blocks 1 \
  --stages 3,4 2>&1 | grep -E "mma bn|best|rror" | sort -t: -k2 -n | head -12
rows8 90 1
rows8 90 1 $F=True
