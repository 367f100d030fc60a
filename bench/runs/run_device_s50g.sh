#!/bin/bash
# Session 50: the pooling launch of an MTP verify step takes the same sequence's earlier rows from the new rows
# (`pool_windows(back=)`), not from the pool their programs store in the same launch (the race behind the multi-token
# steps' run-to-run differences, diag_race.py). Its kernel test (20 launches), the decode-fold model tests, the
# run-to-run diagnostic again, then FUSED_ENTRY_STORE's rows on top of the adopted folds.
source bench/runs/lib.sh
A=dsv4.model.attention
export PYTHONPATH=$PWD
run 200 tests/gpu/test_cache_store.py tests/gpu/test_decode_step_fusions.py
timeout 150 python3 bench/runs/diag_race.py new=4 new-noside=3 old=3 2>&1 | grep -vE "Warning|warn" | tail -10
for f in "$A.FUSED_ENTRY_STORE=False" "$A.FUSED_ENTRY_STORE=True" "$A.FUSED_ENTRY_STORE=False" \
  "$A.FUSED_ENTRY_STORE=True"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
