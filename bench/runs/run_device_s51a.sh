#!/bin/bash
# Prepared in session 50 for session 51 (≈ 8 min; rows in run_device_s51b.sh): three launch folds, interpreter-tested,
# never run on a GPU: block.COMBINE_IN_NEXT_SITE (the routed MoE's combine summed by the next block's mix: one launch
# per layer fewer at B <= 16), mhc.MIX_FINISH_LAST (a one-token site's finish by its mix's last arriver: two per
# layer at B = 1; the "row" finish's bits, so the model's bits move as with COLLAPSE = "row") and
# indexer.TOPK_IN_SCORES (the CSA layers' top-k by the scores launch's last arrivers: one per CSA layer). Their
# tests, then the model-level files with all three on (sed in this device copy, undone after).
source bench/runs/lib.sh
export PYTHONPATH=$PWD
gate 270 tests/gpu/test_site_fusions.py tests/gpu/test_mhc.py tests/gpu/test_moe_combine.py \
  tests/gpu/test_indexer_scores.py tests/gpu/test_topk.py \
  "tests/gpu/test_decode_step_fusions.py::test_topk_in_scores_is_bit_identical" || exit 1
sed -i 's/^COMBINE_IN_NEXT_SITE = False/COMBINE_IN_NEXT_SITE = True/' dsv4/model/block.py
sed -i 's/^MIX_FINISH_LAST = False/MIX_FINISH_LAST = True/' dsv4/kernels/mhc.py
sed -i 's/^TOPK_IN_SCORES = False/TOPK_IN_SCORES = True/' dsv4/model/indexer.py
runpar 300 8 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_block_sites.py \
  tests/gpu/test_decode_step_fusions.py tests/gpu/test_moe.py
sed -i "s/^COMBINE_IN_NEXT_SITE = True/COMBINE_IN_NEXT_SITE = False/" dsv4/model/block.py
sed -i "s/^MIX_FINISH_LAST = True/MIX_FINISH_LAST = False/" dsv4/kernels/mhc.py
sed -i "s/^TOPK_IN_SCORES = True/TOPK_IN_SCORES = False/" dsv4/model/indexer.py
