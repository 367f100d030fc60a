#!/bin/bash
# Session 5, call 5: the single-token FP8 linear on CUDA cores (fp8_gemv) -- its GPU tests and the
# model's, the linears at M = 1 against the session-4 kernel and cuBLAS, 8 Flash layers at B = 1, 8.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 200 python3 -m pytest -q -p no:cacheprovider --tb=short tests/gpu/test_fp8_linear.py tests/gpu/test_model_gpu.py \
    > $OUT/tests.log 2>&1
echo "tests rc=$?"; grep -E "passed|failed|Error" $OUT/tests.log | tail -8
timeout 120 python3 bench/bench_gemm_moe.py --only linear --models flash,pro --ms 1 --out $OUT/lin 2>&1 | grep -E "ceil" | head -2
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/lin/bench.json"))
for r in d["linear"]:
    if "name" not in r or "n" not in r:
        continue
    alts = [round(r[f"alt{i}_us"], 1) for i in range(10) if f"alt{i}_us" in r]
    print(r["model"], r["name"], r["n"], r["k"], "ours", round(r["ours_us"], 1), "gemm", round(r["ours_gemm_us"], 1),
          "cublas", round(r["cublas_us"], 1), "alts", alts)
PY
timeout 120 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 4 --cuda-graphs --batches 1,8 --kv-dtype fp8 \
    --prefill 0 --json $OUT/step.json 2>&1 | grep -v Warn | tail -3
