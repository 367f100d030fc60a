#!/bin/bash
# Session 19, one H200: GPU tests of the changed kernels (indexer scores' MXFP4 key loads, the static operands
# before the PDL wait in norm_rope / store_rows) and the model-level tests, then the 8-layer decode rows.
source bench/runs/lib.sh
run 90 tests/gpu/test_indexer_scores.py tests/gpu/test_norm_rope.py tests/gpu/test_cache_store.py tests/gpu/test_pdl.py
run 240 tests/gpu/test_model_gpu.py
rows8 200 1,8,64
