#!/bin/bash
# Session 75: is the FP8 MoE GEMMs' producer bound by its re-encode's instruction count? The warp-specialized
# kernels on weights in e4m3_reencode.fp8_nibble_order (moe_glu_fp8.FP8_ORDER_PROBE: 7 SASS per packed word instead
# of 12; the producer loop 403 -> 323 instructions offline) against the kernel layout, bit-identical by construction:
# the GPU test first, then the Flash MoE call (L2 flushed) with the default bf16 GLU and with the WS FP8 GLU.
# Ran once (H100, docs/benchmarks.md "Session 75"): 1.4 % of the call at 8K; the probe was then removed (its code is
# commit ddbb27d), so this script no longer runs as is.
source bench/runs/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import sys; sys.path.insert(0, 'bench'); from bench_engine_step import _ceilings; _ceilings(True)" 2>&1 \
  | grep -v -i warn | tail -3
run 280 tests/gpu/test_moe_wide.py -k fp8_ws_is_bit_identical
P=dsv4.kernels.moe_glu_fp8
timeout 280 python3 bench/bench_moe_flags.py --ms 4096,8192,16384 "default:" "order:$P.FP8_ORDER_PROBE=True" \
  "wsglu:$P.WS_GLU=True" "wsglu+order:$P.WS_GLU=True,$P.FP8_ORDER_PROBE=True" 2>&1 | grep -v -i warn | tail -6
