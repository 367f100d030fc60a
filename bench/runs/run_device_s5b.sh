#!/bin/bash
# Session 5, call 2: the CUDA-core MoE decode path (moe_gemv), the fused router, the MTP draft as a
# graph -- GPU tests of those parts, the Flash MoE sweep at decode sizes, 8 Flash layers end to end.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 240 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_moe.py tests/gpu/test_router.py \
    tests/gpu/test_model_gpu.py > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error|torch order" $OUT/tests.log | tail -12
timeout 150 python3 bench/bench_gemm_moe.py --only moe --models flash,pro --ms 1,8,64 --out $OUT/moe 2>&1 | grep -E "^moe|ceil" | head -12
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    ts = {k[:-3]: round(v, 1) for k, v in r.items() if k.endswith("_us") and isinstance(v, float) and
          (k.startswith(("gemv", "ours", "decode", "bm32", "swap128_us", "bw_floor", "peer")))}
    print(r["model"], r["m"], ts)
PY
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -v Warn | tail -5
