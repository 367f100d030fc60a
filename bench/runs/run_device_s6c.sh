#!/bin/bash
# Session 6, call 3: programmatic dependent launch and the whole-row mHC finish on the H200 -- the
# touched kernels' GPU tests, mHC glue old vs new, 8 Flash layers' decode with PDL off and on.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
git checkout -q HEAD -- dsv4 tests  # helpers' unfinished edits stay home
timeout 300 python3 -m pytest -q -x tests/gpu/test_mhc.py tests/gpu/test_cache_store.py tests/gpu/test_router.py \
    tests/gpu/test_norm_rope.py tests/gpu/test_indexer_scores.py tests/gpu/test_moe.py tests/gpu/test_model_gpu.py 2>&1 | tail -4
git show HEAD~1:dsv4/kernels/mhc.py > /tmp/mhc_base.py
python3 bench/bench_glue.py --baseline /tmp/mhc_base.py --tokens 1,8,64 2>&1 | grep -v Warn
for pdl in 0 1; do
  echo "DSV4_PDL=$pdl"
  DSV4_PDL=$pdl timeout 200 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 \
      --kv-dtype fp8 --prefill 0 --json $OUT/step_pdl$pdl.json 2>&1 | grep "B="
done
