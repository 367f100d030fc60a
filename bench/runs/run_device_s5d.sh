#!/bin/bash
# Session 5, call 4: where the CUDA-core MoE path stops paying (M = 16..48 between the measured 8 and
# 64), and 8 Flash layers' decode at B = 1..64 with the corrected switch point.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 150 python3 bench/bench_gemm_moe.py --only moe --models flash,pro --ms 16,24,32,48 --out $OUT/moe 2>&1 | grep -E "ceil" | head -2
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    ts = {k[:-3]: round(r[k], 1) for k in ("ours_us", "decode_bn128_us", "bm32_us", "swap128_us", "gemv32_u2_us", "bw_floor_us") if k in r}
    print(r["model"], r["m"], r["touched"], ts)
PY
timeout 150 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8,16,32,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep -v Warn | tail -6
