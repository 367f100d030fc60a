#!/bin/bash
# Session 75 (not run: the device budget ran out): the GPU test of moe_wide.GLU_CODES, then the A/B that
# decides moe_wide.GLU_CODES: the GLU on two warpgroups of 64 channels each, weights in registers (255 registers
# offline, no spill; sass_stats moe_glu_wide_2wg), without and with its epilogue storing z's codes and scales for the
# FP8 down (no act_quant pass over z), against the default one-warpgroup GLU; Flash MoE call, L2 flushed.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
run 100 tests/gpu/test_moe_wide.py -k glu_codes  # (moe_wide.GLU_CODES, new)
M=dsv4.kernels.moe_wide
timeout 150 python3 bench/bench_moe_flags.py --ms 8192 "default:" \
  "glu2wg:$M.GLU_ONE_WARPGROUP=False,$M.ASYNC_A_SMEM=False,$M.GLU_CODES=False" \
  "glu2wg+codes:$M.GLU_ONE_WARPGROUP=False,$M.ASYNC_A_SMEM=False" 2>&1 | grep -v -i warn | tail -3
run 130 tests/gpu/test_mhc.py  # (the row finish no longer stores u when it norms; last: device time is short)
