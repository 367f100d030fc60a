#!/bin/bash
# Session 51 (after s51a-c): the prefill-size pending combine now launched first (its test), then
# COMBINE_IN_NEXT_SITE and TOPK_IN_SCORES alternating against off (8 Flash layers), then the B = 1 step's kernels in
# launch order (bench/profile_step.py, eager, 4 layers) for the next folds.
source bench/runs/lib.sh
B=dsv4.model.block.COMBINE_IN_NEXT_SITE
K=dsv4.model.indexer.TOPK_IN_SCORES
export PYTHONPATH=$PWD
gate 120 tests/gpu/test_site_fusions.py -k "test_site_sums" || exit 1
for f in "$B=False" "$B=True" "$B=True $K=True" "$B=False" "$B=True" "$B=True $K=True" "$B=False"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
timeout 130 python3 bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --order 2>&1 | grep -v -i warn \
  > $OUT/decode_b1_order.txt
head -70 $OUT/decode_b1_order.txt
