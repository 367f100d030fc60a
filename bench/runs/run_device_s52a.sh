#!/bin/bash
# Prepared in session 51 for session 52 (≈ 6 min): what session 51's device time did not cover --
# indexer.MARK_ABSENT (on) through test_indexer_scores (pick_from_pool's list, indexer_pick's mark_absent), and the
# paged model files with it and COMBINE_IN_NEXT_SITE on (their run timed out after 9 passed).
source bench/runs/lib.sh
export PYTHONPATH=$PWD
gate 150 tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py tests/gpu/test_site_fusions.py || exit 1
runpar 330 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py \
  tests/gpu/test_block_sites.py tests/gpu/test_pdl.py
