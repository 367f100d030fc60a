#!/bin/bash
# Session 68 (carry [".whl"]). (1) The indexer's prefill scores with relu(bf16(s)) as one packed conversion per pair
# (`indexer_scores.PACKED_RELU`, default) against the per-element F2F before it ("default unpacked"), at 56K and 248K
# of prefix, and the launch shapes again (the best one may move once the conversions are cheaper). (2) The GPU tests
# of the indexer kernels and of the engine with sampled rows on the MTP device path (now the default).
source bench/runs/lib.sh
with_llguidance
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 bench/sweep_index_scores.py --prefix 57344 --shapes 64,128,4,3 64,128,8,4 64,256,8,4 \
  128,64,8,2 128,128,8,2 128,128,8,4 128,256,8,3 2>&1 | grep -v -i warn | tail -13
timeout 90 python3 bench/sweep_index_scores.py --prefix 253952 --shapes 64,256,8,4 2>&1 | grep -v -i warn | tail -6
runpar 400 8 tests/gpu/test_indexer_scores.py tests/gpu/test_speculation_gpu.py tests/gpu/test_engine_gpu.py \
  tests/gpu/test_model_gpu.py tests/gpu/test_mixed_steps_gpu.py
