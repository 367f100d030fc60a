#!/bin/bash
# (A record: the f16 variant, moe_wide_async.WIDEN_BF16=False, was removed after s27c; the bf16 path is the only one.)
# Session 27, one H200: the bf16 widening with one byte spread per k pair shared by both nibbles and a 3-op scale
# word (610 instructions per 128-wide K block in the GLU's loop, offline sm_90a, against 639 in s27b's version and
# 998 for the f16 path); with it, whether 64-row tiles, 3 ring slots or another launch order now win.
source bench/runs/lib.sh
run 300 tests/gpu/test_moe_wide.py -k "gluon_widen or mixed or async_kernel_matches or test_fused_moe_wide"
timeout 60 python3 -c "import sys; sys.path.insert(0,'.'); from bench.bench_gemm_moe import ceilings; \
print('ceilings', {k: round(v, 2) for k, v in ceilings().items()})"
F16=dsv4.kernels.moe_wide_async.WIDEN_BF16=False
NO128=dsv4.kernels.moe_config.WIDE_MIN_PAIRS_PER_EXPERT=1073741824,dsv4.kernels.moe_config.MIXED_MIN_PAIRS_PER_EXPERT=1073741824
timeout 200 python3 bench/bench_moe_flags.py --ms 2048,4096,8192,16384 "bf16 widening:" "f16 widening:$F16" \
  "64-row tiles:$NO128" "3 slots:dsv4.kernels.moe_wide.ASYNC_STAGES=3" "group 8:dsv4.kernels.moe_wide.ASYNC_GROUP_M=8" \
  2>&1 | tail -6
timeout 90 python3 bench/bench_moe_wide_shapes.py --ms 8192 --shapes 64,4,reg,4 128,8,reg,4 64,4,reg,3 2>&1 | tail -4
for round in 1 2; do
  echo "== prefill, bf16 widening"; prefill8 100
  echo "== prefill, f16 widening"; prefill8 100 $F16
done
