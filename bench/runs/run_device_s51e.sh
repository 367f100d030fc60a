#!/bin/bash
# Session 51: indexer.MARK_ABSENT (the CSA decode top-k stores -1 for absent picks: the `where` and its fill launch
# after it go, two per CSA layer): kernel tests, the paged model tests, then 8 Flash layers off / on alternating.
source bench/runs/lib.sh
M=dsv4.model.indexer.MARK_ABSENT
export PYTHONPATH=$PWD
gate 80 tests/gpu/test_topk.py -k "mark_absent or matches_reference" tests/gpu/test_indexer_scores.py || exit 1
runpar 170 4 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py
for f in "$M=False" "$M=True" "$M=False" "$M=True"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
