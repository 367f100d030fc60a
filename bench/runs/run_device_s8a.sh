#!/bin/bash
# Prepared in session 7 for the next session's first device call: GPU tests not yet confirmed on the GPU
# after their last edits (router bound, W8A16 split cap, opt-in projections GEMV, MoE split-K), the
# A/B timings of the opt-in variants, and 8 Flash layers' decode as the baseline.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 240 python3 -m pytest -q --maxfail=6 -p no:cacheprovider tests/gpu/test_router.py tests/gpu/test_grouped_w8a16.py \
    tests/gpu/test_projections.py tests/gpu/test_moe_gemv_mma.py 2>&1 | grep -vE "^[.s]+ *\[" | tail -15
timeout 60 python3 bench/bench_glue.py --proj --tokens 1 2>&1 | grep -v Warn | head -12
timeout 120 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1,8 --out $OUT/moe 2>&1 | grep -E "^moe"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    print(r["model"], r["m"], {k[:-3]: round(v, 1) for k, v in r.items() if k.startswith(("ours", "mma", "gemv")) and k.endswith("_us")})
PY
timeout 100 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1,8,64 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep -E "B=|copy"
