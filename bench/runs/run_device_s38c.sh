#!/bin/bash
# Session 38, one H200 (≈ 6 min): `mhc.MIX_COMB_ONCE` (the prefill mix with the post fused in loads comb's 16
# per-token columns once, before its column loop; s38a's Nsight source counters put the loop-top barrier's
# long-scoreboard wait first, and the per-step comb loads were 32 of its 58 cp.async per step). The mHC and
# block-site GPU tests (bits against the torch reference), then the fused site at 8K off / on (CUDA graphs), the
# launch shape re-swept with it, the 4-layer 8K kernel table off / on, and the 8-layer 8K prefill off / on twice.
source bench/runs/lib.sh
run 300 tests/gpu/test_mhc.py tests/gpu/test_block_sites.py
F=dsv4.kernels.mhc.MIX_COMB_ONCE
for on in False True; do
  timeout 60 python3 bench/flags.py $F=$on -- bench/sweep_mhc_mix.py --ops hc_post_pre --rows 32 --cols 64 \
    --warps 4 --calls 3 2>&1 | grep default
done
timeout 150 python3 bench/sweep_mhc_mix.py --ops hc_post_pre --rows 32,64 --cols 32,64 --warps 4,8 --calls 3 2>&1 \
  | tail -7
ktable 120 $F "_mix_kernel|_finish"
prefill_ab 100 $F
