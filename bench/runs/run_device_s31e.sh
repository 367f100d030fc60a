#!/bin/bash
# Session 31, one H200 (≈ 6 min), after s31d. moe_wide.PERM_K: the Gluon GLU's weight pairs read through a
# `pair_view` shared-memory view (perm 1: ldmatrix, 4 instead of 32 16-bit loads per 128-wide K block of the loop;
# perm 2: 8 64-bit loads), the activation columns permuted to match in `dequantized_act`'s launch. Offline sm_90a:
# loop 610 -> 570 (perm 1) / 587 (perm 2) instructions, 245 registers, no spills. s31d's stall ledger of the
# default GLU: LDS.U16 11.2 % + PRMT 10.5 % of the samples. GPU tests, then the MoE call A/B, then an 8-layer 8K
# prefill with perm 1. (Ran in session 31, then a second A/B and the 8-layer prefill with 0 / 2 by hand on the same
# machine: docs/benchmarks.md session 31; PERM_K = 2 is now the default.)
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
run 170 -s tests/gpu/test_moe_wide.py -k "gluon_widen or requant or permute or perm_k"
grep -E "bit-identical" $OUT/pytest_170.txt | head -20
P=dsv4.kernels.moe_wide.PERM_K
timeout 100 python3 bench/bench_moe_flags.py --ms 2048,8192 "perm0:" "perm1:$P=1" "perm2:$P=2" 2>&1 | tail -3
prefill8 80 "$P=1"
