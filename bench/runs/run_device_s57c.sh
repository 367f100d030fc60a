#!/bin/bash
# Session 57, after s57b measured the grammar masks' apply at 1.36 ms of H100 time for 64 rows of 129,280 logits
# (≈ 8 torch launches over a [64, 129280] unpack): the one-launch mask kernel (dsv4/kernels/token_mask.py) against
# its reference, the engine's structured-output GPU test through it, then bench_structured.py again (≈ 4 min with
# the start). Carry [".whl"].
source bench/runs/lib.sh
with_llguidance
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -rf --tb=short -p no:cacheprovider tests/gpu/test_token_mask.py \
  "tests/gpu/test_engine_gpu.py::test_structured_outputs_on_the_gpu" 2>&1 | tail -4
timeout 150 python3 bench/bench_structured.py --reps 10 2>&1 | tail -7
