#!/bin/bash
# Prepared in session 37 for session 38, one H200 (≈ 5 min): where the prefill mHC mix with the post fused in waits
# (≈ 277 µs per site at 8K, two sites per layer since FUSE_BLOCK_SITES; 44.5 % of DRAM bandwidth at 2 CTAs of 4
# warps per SM, s36b). (1) Nsight's source counters on one `_mix_kernel` launch: the 30 SASS lines with the most
# stall samples (is it the cp.async ring, the plain comb / post loads, or the wgmma's fence?); (2) the launch shape
# re-swept under today's defaults (tile rows x columns x warps; µs per fused site in CUDA graphs).
source bench/runs/lib.sh
KERNEL=_mix_kernel ncu_src 150 mix_src bench/sweep_mhc_mix.py --ops hc_post_pre --rows 32 --cols 64 --warps 4 \
  --calls 1
timeout 200 python3 bench/sweep_mhc_mix.py --ops hc_post_pre --rows 16,32,64 --cols 32,64,128 --warps 4,8 \
  --calls 3 2>&1 | tail -22
