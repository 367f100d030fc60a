#!/bin/bash
# Session 38, one H200 (≈ 8 min; PIPELINED and MIX_COMB_ONCE were removed after it ran, as measured): the GPU tests
# (mHC and block sites: bits against the torch reference; the Gluon attention's PIPELINED loop: the plain loop's
# bits), the fused mHC site at 8K with `mhc.MIX_COMB_ONCE` off / on (CUDA graphs), then the 4-layer 8K kernel
# table: the defaults (comb once on, 64-key attention tiles on 2 slots), comb once off, 32-key tiles on 4 slots,
# PIPELINED on 4 and on 3 slots; the 8-layer 8K prefill default / PIPELINED on 4 slots.
source bench/runs/lib.sh
run 240 tests/gpu/test_mhc.py tests/gpu/test_block_sites.py tests/gpu/test_prefill_attention_gluon.py
F=dsv4.kernels.mhc.MIX_COMB_ONCE
G=dsv4.kernels.prefill_attention_gluon
for on in False True; do
  timeout 50 python3 bench/flags.py $F=$on -- bench/sweep_mhc_mix.py --ops hc_post_pre --rows 32 --cols 64 \
    --warps 4 --calls 3 2>&1 | grep default
done
K="_attn_kernel|_mix_kernel"
ktab 90 "$K"
ktab 90 "$K" $F=False
ktab 90 "$K" $G.BN=32 $G.STAGES=4
ktab 90 "$K" $G.BN=32 $G.STAGES=4 $G.PIPELINED=True
ktab 90 "$K" $G.BN=32 $G.STAGES=3 $G.PIPELINED=True
prefill8 60
prefill8 60 $G.BN=32 $G.STAGES=4 $G.PIPELINED=True
