#!/bin/bash
# Session 7, call 2: GPU tests of the session's new kernels (W8A16 split-K, fused router, MoE MMA
# decode variant, stacked FP8 pairs), their A/B sweeps, 8 Flash layers' decode B = 1/8/64, and the
# B = 1 step's kernels in launch order and its remaining host waits.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_router.py tests/gpu/test_grouped_w8a16.py \
    tests/gpu/test_moe_gemv_mma.py tests/gpu/test_fused_fp8_linears_gpu.py 2>&1 | tail -8
timeout 120 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1,8,64 --out $OUT/moe 2>&1 | grep -v Warn | grep -E "^flash|M=|ceil" | head -40
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    us = {k[:-3]: round(v, 1) for k, v in r.items() if k.endswith("_us") and isinstance(v, float)}
    print(r["model"], r["m"], "best", r["best_config"], us)
PY
timeout 40 python3 bench/bench_gemm_moe.py --only grouped --models flash --ms 1,8,64 --out $OUT/grouped 2>&1 | grep "wo_a grouped"
timeout 100 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep -E "B=|copy"
timeout 60 python3 bench/profile_step.py --layers 4 --order 2>&1 | grep -v Warn > $OUT/order.txt
head -3 $OUT/order.txt; grep -A30 "kernels by GPU time" $OUT/order.txt | head -30
timeout 50 python3 bench/profile_step.py --layers 8 --host --syncs 2>&1 | grep -v Warn | tail -25
