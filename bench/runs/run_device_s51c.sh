#!/bin/bash
# Session 51: the site-fusion gate's two failures: where the t = 20 pending-combine site differs; the model test
# with one sequence (paged_driver fixed); then the model-level files with the three folds on.
source bench/runs/lib.sh
export PYTHONPATH=$PWD
python bench/runs/diag_site20.py 2>&1 | tail -30
gate 200 tests/gpu/test_site_fusions.py -k "not 0-True-20" || exit 1
sed -i 's/^COMBINE_IN_NEXT_SITE = False/COMBINE_IN_NEXT_SITE = True/' dsv4/model/block.py
sed -i 's/^MIX_FINISH_LAST = False/MIX_FINISH_LAST = True/' dsv4/kernels/mhc.py
sed -i 's/^TOPK_IN_SCORES = False/TOPK_IN_SCORES = True/' dsv4/model/indexer.py
runpar 300 8 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_block_sites.py \
  tests/gpu/test_decode_step_fusions.py tests/gpu/test_moe.py
