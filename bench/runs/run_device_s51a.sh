#!/bin/bash
# Prepared in session 50 for session 51 (≈ 8 min): two launch folds into the mHC sites, interpreter-tested, never run
# on a GPU: block.COMBINE_IN_NEXT_SITE (the routed MoE's combine summed by the next block's one-token mix: one launch
# per layer fewer at B = 1) and mhc.MIX_FINISH_LAST (a one-token site's finish by its mix's last arriver: two per
# layer; the "row" finish's bits, so the model's bits move as with COLLAPSE = "row"). Their tests, then the
# model-level files with both on (sed in this device copy), then 8 Flash layers' rows: off, each, both, alternating.
source bench/runs/lib.sh
B=dsv4.model.block.COMBINE_IN_NEXT_SITE
M=dsv4.kernels.mhc.MIX_FINISH_LAST
export PYTHONPATH=$PWD
gate 300 tests/gpu/test_site_fusions.py tests/gpu/test_mhc.py tests/gpu/test_moe_combine.py || exit 1
sed -i 's/^COMBINE_IN_NEXT_SITE = False/COMBINE_IN_NEXT_SITE = True/' dsv4/model/block.py
sed -i 's/^MIX_FINISH_LAST = False/MIX_FINISH_LAST = True/' dsv4/kernels/mhc.py
runpar 300 6 tests/gpu/test_model_gpu.py tests/gpu/test_parallel_graphs.py tests/gpu/test_block_sites.py \
  tests/gpu/test_decode_step_fusions.py
sed -i "s/^COMBINE_IN_NEXT_SITE = True/COMBINE_IN_NEXT_SITE = False/" dsv4/model/block.py
sed -i "s/^MIX_FINISH_LAST = True/MIX_FINISH_LAST = False/" dsv4/kernels/mhc.py
for f in "$B=False" "$B=True" "$M=True" "$B=True $M=True" "$B=False" "$B=True $M=True"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
