#!/bin/bash
# Session 4, last device call: every GPU test, 8 Flash layers (whole-step graphs, paged FP8, 8K prefill
# through the prefill attention kernel), and the Flash MoE at decode sizes (default vs the swap option).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 330 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -8
timeout 130 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step_1k.json 2>&1 | grep -v Warn | tail -5
timeout 120 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1,8,64 --out $OUT/moe 2>&1 | grep -E "^moe|ceil" | head -8
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    print(r["model"], r["m"], {k[:-3]: round(v, 1) for k, v in r.items() if k in ("ours_us", "swap128_us", "swap64_us", "decode_bn128_us", "bw_floor_us", "peer_us")})
PY
