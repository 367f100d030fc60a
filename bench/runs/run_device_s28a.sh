#!/bin/bash
# Prepared in session 27, one H200 (≈ 4-5 min): (1) the wide MoE kernel below 16 pairs per expert (session 27 moved
# its lower bound from 40 to 16 on measured wins at 18-36; 12 and below not measured); (2) where an 8K prefill
# layer's time goes after session 27's MoE change (kernels by part), to pick the next target for #6's 20k tok/s;
# (3) the down GEMM with 256 weight rows per program (below).
source bench/runs/lib.sh
C=dsv4.kernels.moe_config
timeout 100 python3 bench/bench_moe_flags.py --ms 256,384,512,640 "default:" \
  "wide from 4:$C.WIDE64_MIN_PAIRS_PER_EXPERT=4" 2>&1 | tail -5
# (3) the down GEMM with 256 weight rows per program (two warpgroups of 128: half the z re-reads, 36 instead of 45
# instructions per wgmma; offline sm_90a: 231 registers, no spills, 1 CTA per SM). Read the GEMM2 column: the GLU
# of that shape spills. If it wins, moe_wide's bn2 check (64 or 128) and MoEConfig.bn2 need 256.
timeout 150 python3 bench/bench_moe_wide_shapes.py --ms 8192,16384 --shapes 128,8,reg,4 256,8,reg,4 256,8,reg,3 \
  2>&1 | tail -7
timeout 150 python3 bench/flags.py "dsv4.model.side_stream.OVERLAP=()" -- bench/profile_step.py --layers 4 \
  --prefill 8192 2>&1 | tail -40
