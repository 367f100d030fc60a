#!/bin/bash
# Session 52: attention.INDEXER_BESIDE (a CSA layer's indexer chain -- its wq_b, queries, scores, top-k -- on a third
# stream beside the attention's wq_b): 8 Flash layers off / on alternating, the B = 1 timeline with it on, then the
# GPU tests of the branch (bit-identity against inline, eager and under graphs).
source bench/runs/lib.sh
I=dsv4.model.attention.INDEXER_BESIDE
export PYTHONPATH=$PWD
for f in "$I=False" "$I=True" "$I=False" "$I=True"; do
  echo "== $f"; rows8 100 1,2 $f | grep -E "replay|copy" | sed -E 's/MTP draft.*//'
done
timeout 150 python3 bench/flags.py $I=True -- bench/profile_step.py --layers 4 --batch 1 --ctx 4096 --timeline \
  --kernels > $OUT/timeline_on.txt 2>&1
grep "decode step" $OUT/timeline_on.txt
runpar 260 8 tests/gpu/test_decode_step_fusions.py tests/gpu/test_model_gpu.py -k "beside or side_stream or q_norm"
