#!/bin/bash
# Session 4, fourth device call: swap-AB MoE with f16 operands (exact fp32 accumulation), block tables
# cached on the device (prefill host waits), then GPU tests, MoE decode sizes, 8 Flash layers.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
[ -f bench/diag_embedded.py ] && timeout 120 python3 bench/diag_embedded.py 2>&1 | grep -v Warn | tail -4
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_moe.py tests/gpu/test_model_gpu.py \
    > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -8
timeout 150 python3 bench/bench_gemm_moe.py --only moe --ms 1,8,64 --no-sweep --out $OUT/moe 2>&1 | grep -E "^moe" | head -12
TOP=0 timeout 100 python3 bench/profile_step.py --layers 4 --prefill 8192 --syncs 2>&1 | grep -v Warn | grep -A8 "host waits"
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step_1k.json 2>&1 | grep -v Warn | tail -5
