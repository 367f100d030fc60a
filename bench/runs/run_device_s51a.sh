#!/bin/bash
# Prepared in session 50 for session 51 (≈ 7 min): block.COMBINE_IN_NEXT_SITE (the routed MoE's combine summed by
# the next block's one-token mHC mix: one launch per layer fewer at B = 1; interpreter-tested, never run on a GPU).
# Its kernel / model tests, then the graph tests with it on (sed in this device copy), then 8 Flash layers' rows
# off / on alternating. Adopt if it passes and B = 1 does not lose.
source bench/runs/lib.sh
B=dsv4.model.block
export PYTHONPATH=$PWD
gate 300 tests/gpu/test_combine_in_site.py tests/gpu/test_mhc.py tests/gpu/test_moe_combine.py || exit 1
sed -i 's/^COMBINE_IN_NEXT_SITE = False/COMBINE_IN_NEXT_SITE = True/' dsv4/model/block.py
runpar 300 6 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_block_sites.py \
  tests/gpu/test_decode_step_fusions.py
sed -i "s/^COMBINE_IN_NEXT_SITE = True/COMBINE_IN_NEXT_SITE = False/" dsv4/model/block.py
for f in False True False True; do
  echo "== COMBINE_IN_NEXT_SITE=$f"; rows8 100 1,2 $B.COMBINE_IN_NEXT_SITE=$f | grep -E "replay|copy" \
    | sed -E 's/MTP draft.*//'
done
