#!/bin/bash
# Session 54 (≈ 5.5 min): attention.INDEXER_BESIDE, block.STEP_TABLES_BESIDE and side_stream.PRIORITY {2: -1, 3: -1}
# are now the defaults: the model-level GPU files with them and the 8-layer rows (B = 1, 8).
source bench/runs/lib.sh
export PYTHONPATH=$PWD
runpar 260 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py \
  tests/gpu/test_stack_rebuild_beside.py tests/gpu/test_block_sites.py tests/gpu/test_site_fusions.py
rows8 80 1,8 | sed -E 's/MTP draft.*//'
