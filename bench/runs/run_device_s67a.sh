#!/bin/bash
# Prepared in session 66 (≈ 5 min with the start). The Gluon wide kernel's launch knobs at the new small token tiles
# (16 to 12 pairs per expert, 32 to 24; session 66 measured only the tiles, with every knob as tuned for 64- and
# 128-row tiles). The MoE call sits at 57-62 % of copy there (Flash M = 192-1024: 1.84-2.08 ms for 3.4 GB of
# experts). µs per call of 8 routings in one CUDA graph; share of outputs equal to the default's, rel RMS difference.
# A knob that wins only at these tiles needs a per-tile setting before it can become a default.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
# the expert-parallel partials at the launch shapes a rank now takes (moe_comm.rank_moe_config; new in session 66,
# not yet run on a GPU: the interpreter's numerics are not the GPU's for these kernels)
runpar 120 4 tests/gpu/test_moe.py
W=dsv4.kernels.moe_wide
V=("default:" "down 1 wg:$W.DOWN_ONE_WARPGROUP=True" "glu 2 wg:$W.GLU_ONE_WARPGROUP=False" "stages 3:$W.ASYNC_STAGES=3"
   "stages 6:$W.ASYNC_STAGES=6" "group 1:$W.ASYNC_GROUP_M=1" "group 16:$W.ASYNC_GROUP_M=16"
   "a smem:$W.ASYNC_A_SMEM=True" "fp8 down:$W.FP8_DOWN_MIN_PAIRS_PER_EXPERT=0")
timeout 200 python3 bench/bench_moe_flags.py --ms 192,384,768,1024 --graphs 8 "${V[@]}" 2>&1 | grep -v -i warn \
  | tail -5
timeout 200 python3 bench/bench_moe_flags.py --experts pro --ms 256,1024 --graphs 8 "${V[@]}" 2>&1 | grep -v -i warn \
  | tail -3
timeout 60 python3 -c "from bench.sweep_linear import copy_bandwidth; print(f'copy {copy_bandwidth():.2f} TB/s')" \
  2>&1 | tail -1
