#!/bin/bash
# Prepared in session 52 for session 53 (≈ 8 min): the rows of session 52's opt-in decode-step branches, alternating
# twice with the defaults -- attention.INDEXER_BESIDE as it stands after s52b (the key slots now derived in the
# branch), with high-priority side streams (side_stream.PRIORITY), and block.STEP_TABLES_BESIDE (the later layers'
# step tables beside the first layer). s52c (the first three settings) was lost with the device. Then
# run_device_s53b.sh (their GPU tests and a timeline).
source bench/runs/lib.sh
I=dsv4.model.attention.INDEXER_BESIDE=True
S=dsv4.model.block.STEP_TABLES_BESIDE=True
P2="dsv4.model.side_stream.PRIORITY={2:-1,3:-1}"
export PYTHONPATH=$PWD
for round in 1 2; do
  for f in "" "$I" "$I $P2" "$S" "$I $S $P2"; do
    echo "== ${f:-defaults}"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
  done
done
