#!/bin/bash
# Session 50, after run_device_s50c.sh's gate: FUSED_ENTRY_STORE's model-level test failed on the GPU (the other three
# folds passed). Its per-launch diagnostic first, then 8 Flash layers' rows for the three that passed: off / on
# alternating, then each alone.
source bench/runs/lib.sh
A=dsv4.model.attention
export PYTHONPATH=$PWD
timeout 150 python3 bench/runs/diag_entry_store.py 2>&1 | grep -vE "Warning|warn" | tail -10
ALL="$A.FUSED_KV_STORE=True $A.DECODE_Q_NORM_IN_KERNEL=True $A.COMPRESS_BESIDE=True"
for f in "$A.FUSED_KV_STORE=False" "$ALL" "$A.FUSED_KV_STORE=False" "$ALL" "$A.FUSED_KV_STORE=True" \
  "$A.DECODE_Q_NORM_IN_KERNEL=True" "$A.COMPRESS_BESIDE=True"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
