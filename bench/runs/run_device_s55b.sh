#!/bin/bash
# Session 55 (≈ 5 min): session 54's defaults (the side branches beside, at high priority; measured at B = 1 and 8)
# against the previous inline chain at B = 64, alternating twice.
source bench/runs/lib.sh
export PYTHONPATH=$PWD
OLD="dsv4.model.attention.INDEXER_BESIDE=False dsv4.model.block.STEP_TABLES_BESIDE=False dsv4.model.side_stream.PRIORITY={}"
for f in "" "$OLD" "" "$OLD"; do
  echo "== ${f:-defaults}"; rows8 100 64 $f | grep -E "replay" | sed -E 's/chained.*//'
done
