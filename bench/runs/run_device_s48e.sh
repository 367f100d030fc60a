#!/bin/bash
# Session 48 (≈ 1.5 min): the decode GLU's activation tiles built from one batched load (was a chain of per-tile
# loads): its tests, the MoE call against the Triton GLU, the GLU / down GEMVs alone vs touched bytes & copy BW.
source bench/runs/lib.sh
G=dsv4.kernels.moe_glu_decode
gate 200 tests/gpu/test_moe_glu_decode.py || exit 1
timeout 200 python3 bench/bench_moe_flags.py --ms 1,2,4 --graphs 16 "default:" "triton GLU:$G.ENABLED=False" \
  "default again:" 2>&1 | tail -4
timeout 200 python3 bench/bench_moe_stages.py --tokens 1,2,4 2>&1 | tail -13
