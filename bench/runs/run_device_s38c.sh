#!/bin/bash
# Session 38, one H200 (≈ 6 min): `mhc.MIX_COMB_ONCE` (the prefill mix with the post fused in loads comb's 16
# per-token columns once, before its column loop; s38a's Nsight source counters put the loop-top barrier's
# long-scoreboard wait first, and the per-step comb loads were 32 of its 58 cp.async per step). The GPU tests (mHC
# and block sites: bits against the torch reference; the Gluon attention's new PIPELINED loop: the plain loop's
# bits), then the fused site at 8K off / on (CUDA graphs) and the 4-layer 8K kernel table off / on.
source bench/runs/lib.sh
run 300 tests/gpu/test_mhc.py tests/gpu/test_block_sites.py tests/gpu/test_prefill_attention_gluon.py
F=dsv4.kernels.mhc.MIX_COMB_ONCE
for on in False True; do
  timeout 60 python3 bench/flags.py $F=$on -- bench/sweep_mhc_mix.py --ops hc_post_pre --rows 32 --cols 64 \
    --warps 4 --calls 3 2>&1 | grep default
done
ktable 120 $F "_mix_kernel|_finish"
