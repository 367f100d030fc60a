#!/bin/bash
# Session 43 (≈ 6 min): two decode-chain changes prepared offline, both bit-identical in the interpreter --
# router.PACKED_TOPK (the top-k as one 64-bit max per pick, the scores gathered: 65 -> 31 CTA barriers in the Flash
# gate_route's SASS) with router.BIAS_EARLY (bias loaded before the PDL wait), and projections.POS_EARLY (positions
# loaded right after the wait, not by the last arriver after the partial sums). Their GPU tests; the router variants
# and the projection paths in CUDA graphs (bench_glue); where one eager B = 1 step's kernel time goes (4 layers,
# ctx 4096); the 8-layer B = 1 rows default vs all three flags.
source bench/runs/lib.sh
run 200 tests/gpu/test_router.py tests/gpu/test_projections.py
timeout 120 python3 bench/bench_glue.py --router --tokens 1,8 2>&1 | grep -vE "Warning|warn" | tail -6
timeout 120 python3 bench/bench_glue.py --proj --tokens 1 2>&1 | grep -E "^(CSA|HCA)|projections|rror" | head -8
timeout 150 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 2>&1 | grep -vE "Warning|warn" | tail -40
rows8 150 1
rows8 150 1 dsv4.kernels.router.PACKED_TOPK=True dsv4.kernels.router.BIAS_EARLY=True \
  dsv4.kernels.projections.POS_EARLY=True
