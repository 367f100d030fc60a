#!/bin/bash
# Session 6, call 4: every GPU test on the new decode pieces (split-K in the GEMM, fused projections,
# one-launch top-k, W8A16 wo_a, rows stored by the pooling launch), decode-attention split sweep, mHC
# finish with the Sinkhorn beside the collapse, and 8 Flash layers' decode.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
git checkout -q HEAD -- dsv4/model/moe.py  # the shared-expert helper is not done
rm -f dsv4/kernels/swiglu.py tests/gpu/test_swiglu.py tests/test_shared_expert_fused.py
timeout 400 python3 -m pytest -q --maxfail=10 tests/gpu -p no:cacheprovider --durations=8 2>&1 | tail -22
git show HEAD:dsv4/kernels/mhc.py > /tmp/mhc_base.py
timeout 120 python3 bench/bench_glue.py --baseline /tmp/mhc_base.py --tokens 1,8 --attn 2>&1 | grep -v Warn
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep "B="
