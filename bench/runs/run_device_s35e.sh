#!/bin/bash
# Session 35, one H200: before moe_wide.FP8_DOWN becomes the default -- the GPU MoE and model tests with it on, the
# Flash and Pro MoE calls default vs FP8 down, the 8-layer 8K prefill off / on / off / on (noise check).
source bench/runs/lib.sh
F=dsv4.kernels.moe_wide
PT=$(python3 -c "import os, pytest; print(os.path.join(os.path.dirname(pytest.__file__), '__main__.py'))")
timeout 300 python3 bench/flags.py $F.FP8_DOWN=True -- $PT -q -rf --tb=line -p no:cacheprovider tests/gpu/test_moe.py \
  tests/gpu/test_moe_wide.py tests/gpu/test_model_gpu.py -k "not speculative and not overlap" 2>&1 \
  | grep -E "passed|failed|FAILED|rror" | tail -12
timeout 100 python3 bench/bench_moe_flags.py --ms 1024,2048,8192,16384 "default:" "fp8 down:$F.FP8_DOWN=True" 2>&1 | tail -5
timeout 100 python3 bench/bench_moe_flags.py --experts pro --ms 2048,8192 "default:" "fp8 down:$F.FP8_DOWN=True" 2>&1 \
  | tail -3
prefill8 100
prefill8 100 $F.FP8_DOWN=True
prefill8 100
prefill8 100 $F.FP8_DOWN=True
