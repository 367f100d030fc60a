#!/bin/bash
# Session 5, last device call: every GPU test, 8 Flash layers end to end (whole-step graphs, MTP draft
# graphs, fused router, indexer scores from the FP4 pool, CUDA-core MoE decode), the MoE at decode sizes.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -12
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -v Warn | tail -5
timeout 90 python3 bench/bench_gemm_moe.py --only moe --models flash,pro --ms 1,8,64 --no-sweep --out $OUT/moe 2>&1 | grep -E "^moe|ceil" | head -12
timeout 60 python3 bench/profile_step.py --layers 4 2>&1 | grep -v Warn | tail -30
