#!/bin/bash
# Session 65 (≈ 4 min warm): the routed MoE at 3-12 pairs per expert (decode B = 128-512, short prefills, mixed
# steps), where every kernel takes ≈ 2-3x the expert weights' read time. The default against each kernel forced:
# the per-group kernel's 16-row tiles, and the wide kernel (bf16 wgmma, the widened weights as the register operand)
# with 16-, 32- and 64-token tiles (its wgmma N; new moe_config.WIDE_SMALL_BM). Flash experts, µs per call of 8
# routings in one CUDA graph; the share of outputs equal to the default's and the relative RMS difference.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
C=dsv4.kernels.moe_config
OFF="$C.GEMV_PAIRED_MAX=0,$C.GEMV_MAX_PAIRS_PER_EXPERT=0"
WIDE="$OFF,$C.PER_GROUP_MAX_PAIRS_PER_EXPERT=0,$C.WIDE64_MIN_PAIRS_PER_EXPERT=0"
timeout 420 python3 bench/bench_moe_flags.py --ms 128,192,256,384,512 --graphs 8 "default:" \
  "group16:$OFF,$C.PER_GROUP_MAX_PAIRS_PER_EXPERT=1000" "wide16:$WIDE,$C.WIDE_SMALL_BM=16" \
  "wide32:$WIDE,$C.WIDE_SMALL_BM=32" "wide64:$WIDE,$C.WIDE_SMALL_BM=64" 2>&1 | grep -v -i warn | tail -8
timeout 60 python3 -c "from bench.sweep_linear import copy_bandwidth; print(f'copy {copy_bandwidth():.2f} TB/s')" \
  2>&1 | tail -1
