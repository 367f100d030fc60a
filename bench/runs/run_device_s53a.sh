#!/bin/bash
# Prepared in session 52 for session 53 (≈ 7 min): attention.INDEXER_BESIDE as it stands after s52b (the key slots now
# derived in the branch, off the main stream) and side_stream.PRIORITY (high-priority side streams; the projections'
# branch on a lane of its own for the last setting). s52c, the same, was lost with the device. Rows first (8 Flash
# layers, three / four settings alternating twice), then the B = 1 timeline of the best guess, then the GPU tests.
source bench/runs/lib.sh
I=dsv4.model.attention.INDEXER_BESIDE
P2="dsv4.model.side_stream.PRIORITY={2:-1}"
P3="dsv4.model.side_stream.PRIORITY={2:-1,3:-1}"
L3="dsv4.model.side_stream.LANES={'shared_expert':1,'projections':3,'indexer':2}"
export PYTHONPATH=$PWD
for round in 1 2; do
  for f in "$I=False" "$I=True" "$I=True $P2" "$I=True $P3 $L3"; do
    echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
  done
done
timeout 150 python3 bench/flags.py $I=True $P2 -- bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline \
  --kernels > $OUT/timeline_on.txt 2>&1
grep "decode step" $OUT/timeline_on.txt
runpar 240 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py -k "beside or side_stream"
