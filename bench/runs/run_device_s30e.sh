#!/bin/bash
# Session 30, one H200 (≈ 5 min), after s30d. (1) mhc.COLLAPSE_PREFILL "split" (default) vs "row" at 8K tokens:
# the mHC finish kernels' GPU time in one 8K forward of 4 layers (split: 9 programs per token incl. the Sinkhorn one,
# a last-arriver norm; row: 2). (2) the prefill attention at 128-key tiles, one stage (sass_stats: 1,163 instructions
# per 64 keys in the entries loop against 1,393, but 1.8 KB spilled). (3) the 8-layer 8K prefill on this tree.
# (Ran in session 30: "row" measured slower; the COLLAPSE_PREFILL flag was removed. Not rerunnable as is.)
source bench/runs/lib.sh
python3 -c "import bench.bench_gemm_moe as b; print('ceilings', b.ceilings())" 2>&1 | tail -1  # this call's
run 100 tests/gpu/test_mhc.py
for V in "'split'" "'row'"; do
  echo "COLLAPSE_PREFILL=$V"
  timeout 60 python3 bench/flags.py dsv4.kernels.mhc.COLLAPSE_PREFILL="$V" -- bench/profile_step.py --layers 4 \
    --prefill 8192 2>&1 | grep -E "wall|kernels,|_finish|_mix_kernel"
done
timeout 80 python3 bench/bench_prefill_glue.py --skip select queries --kv-one-load \
  --shapes 512,64,8,2 512,128,8,1 512,64,8,1 2>&1 | tail -4
prefill8 100
