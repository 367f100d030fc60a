#!/bin/bash
# Prepared in session 30 for session 31, one H200 (≈ 4 min), after s31a: the mHC "block" finish for prefill sizes
# (mhc.COLLAPSE_PREFILL = "block": BLOCK_T tokens per program, one thread-local Sinkhorn per token; interpreter-tested,
# compiled offline: 127 registers, no spills, no CTA barriers in the Sinkhorn where "split" has 79 per token).
# s30d: the split finish takes 1,916-2,043 µs per 4-layer 8K forward (≈ 50 % of copy bandwidth) in ≈ 74K programs
# per site. GPU tests, then finish-kernel time per variant and BLOCK_T; make "block" the prefill default if the tests
# pass and it is faster (then note the 8-layer 8K prefill).
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
run 150 tests/gpu/test_mhc.py
M=dsv4.kernels.mhc
for V in "$M.COLLAPSE_PREFILL='split'" "$M.COLLAPSE_PREFILL='block'" "$M.COLLAPSE_PREFILL='block' $M.BLOCK_T=4" \
         "$M.COLLAPSE_PREFILL='block' $M.BLOCK_T=16"; do
  echo "$V"
  timeout 60 python3 bench/flags.py $V -- bench/profile_step.py --layers 4 --prefill 8192 2>&1 \
    | grep -E "wall|kernels,|_finish|_mix_kernel"
done
prefill8 100 "$M.COLLAPSE_PREFILL='block'"
# moe_align "blocks" pairs per program: 512 makes 96 scatter programs at 8K tokens (fewer than the 132 SMs; s30d:
# ≈ 39 µs per scatter launch); 256 / 128 make 192 / 384
B=dsv4.kernels.moe_align.BLOCK_PAIRS
timeout 90 python3 bench/bench_moe_flags.py --ms 2048,8192 "512:" "256:$B=256" "128:$B=128" 2>&1 | tail -3
