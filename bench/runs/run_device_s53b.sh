#!/bin/bash
# Prepared in session 52 for session 53 (≈ 7 min): the GPU tests of the opt-in decode-step branches (bit-identity
# against inline, eager and under CUDA graphs, and against the chain on the main stream), then the B = 1 timeline with
# both on (`profile_step.py --timeline --kernels`: where the first CSA layer's chain now ends).
source bench/runs/lib.sh
export PYTHONPATH=$PWD
# whole files (session 53 changed the default path's RoPE angles: the positions' cast folded into the multiply)
runpar 400 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py tests/gpu/test_norm_rope.py \
  tests/gpu/test_engine_gpu.py tests/gpu/test_sampler_gpu.py
timeout 150 python3 bench/flags.py dsv4.model.attention.INDEXER_BESIDE=True dsv4.model.block.STEP_TABLES_BESIDE=True \
  -- bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline --kernels > $OUT/timeline_on.txt 2>&1
grep "decode step" $OUT/timeline_on.txt
