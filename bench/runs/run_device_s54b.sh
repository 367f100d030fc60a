#!/bin/bash
# Session 54 (≈ 6 min): attention.INDEXER_BESIDE, block.STEP_TABLES_BESIDE and side_stream.PRIORITY {2: -1, 3: -1}
# are now the defaults: the model-level GPU files with them, the 8-layer rows (B = 1, 8, 64), and one row pair with
# the first side lane (projections' branch, shared expert) at high priority too.
source bench/runs/lib.sh
export PYTHONPATH=$PWD
runpar 260 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py tests/gpu/test_engine_gpu.py \
  tests/gpu/test_stack_rebuild_beside.py tests/gpu/test_block_sites.py tests/gpu/test_site_fusions.py
rows8 90 1,8,64 | sed -E 's/MTP draft.*//'
echo "== lane 1 (projections' branch, shared expert) high too"
rows8 70 1,8 "dsv4.model.side_stream.PRIORITY={1:-1,2:-1,3:-1}" | grep "B=" | sed -E 's/MTP draft.*//'
