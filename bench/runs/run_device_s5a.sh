#!/bin/bash
# Session 5, call 1: MoE with joined row-block scales (MoEConfig.join) vs the per-group kernels --
# GPU tests of the MoE and the model, the Flash MoE sweep over decode and prefill sizes, 8 Flash layers.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_moe.py tests/gpu/test_model_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -12
timeout 200 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1,8,64,1024,4096,8192 --out $OUT/moe 2>&1 | grep -E "^moe|ceil" | head -12
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    ts = {k[:-3]: round(v, 1) for k, v in r.items() if k.endswith("_us") and isinstance(v, float)}
    print(r["model"], r["m"], ts)
PY
timeout 130 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -v Warn | tail -5
