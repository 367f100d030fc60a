#!/bin/bash
# Session 4, first device call: MoE kernel tests + swap-AB sweep at decode sizes, the model's GPU
# tests with bf16 tensor-core GEMMs into fp32 for plain linears / router / prefill attention, an 8K
# prefill profile, and 8 Flash layers of decode + 8K prefill.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_moe.py tests/gpu/test_bf16_gemm.py \
    tests/gpu/test_model_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -12
timeout 200 python3 bench/bench_gemm_moe.py --only moe --ms 1,8,64 --out $OUT/moe 2>&1 | grep -E "^moe|ceilings" | head -20
echo "--- sweep (us)"; python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    al = {k[:-3]: round(v, 1) for k, v in r.items() if k.endswith("_us") and k not in ("bw_floor_us",)}
    print(r["model"], r["m"], r["touched"], "floor", round(r["bw_floor_us"], 1), al)
PY
TOP=30 timeout 120 python3 bench/profile_step.py --layers 4 --prefill 8192 2>&1 | grep -v Warn | tail -45
timeout 120 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step_1k.json 2>&1 | grep -v Warn | tail -5
