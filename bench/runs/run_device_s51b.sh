#!/bin/bash
# Prepared in session 50 for session 51 (≈ 5 min), after run_device_s51a.sh passes: 8 Flash layers' rows (ctx 4096,
# paged FP8, graphs) for the three prepared folds: off, each alone, all, alternating. Adopt what does not lose at
# B = 1 (MIX_FINISH_LAST: also compare with mhc.COLLAPSE = "row" alone, whose bits it has).
source bench/runs/lib.sh
B=dsv4.model.block.COMBINE_IN_NEXT_SITE
M=dsv4.kernels.mhc.MIX_FINISH_LAST
K=dsv4.model.indexer.TOPK_IN_SCORES
export PYTHONPATH=$PWD
for f in "$B=False" "$B=True" "$M=True" "$K=True" "$B=True $M=True $K=True" "$B=False" "$B=True $M=True $K=True"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
