#!/bin/bash
# Session 52: INDEXER_BESIDE with the key slots derived in the branch, and high-priority side streams for the indexer
# and projections lanes (side_stream.PRIORITY): 8 Flash layers, three settings alternating twice; the B = 1 timeline
# of the last; the branch's GPU tests.
source bench/runs/lib.sh
I=dsv4.model.attention.INDEXER_BESIDE
P="dsv4.model.side_stream.PRIORITY={1:0,2:-1,3:-1}"
export PYTHONPATH=$PWD
for round in 1 2; do
  for f in "$I=False" "$I=True" "$I=True $P"; do
    echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
  done
done
timeout 150 python3 bench/flags.py $I=True $P -- bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline \
  --kernels > $OUT/timeline_on.txt 2>&1
grep "decode step" $OUT/timeline_on.txt
runpar 200 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py -k "indexer_beside"
# (s52: the device stopped answering during this call and no result came back; session 53 runs run_device_s53a.sh)
