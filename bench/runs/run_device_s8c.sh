#!/bin/bash
# Session 8, call 3: the bf16-wgmma prefill MoE after its cheaper widening (bit moves + one multiply per
# weight, one dot per 32-wide group): GPU tests (also the model and decode MoE on the new defaults), the MoE
# sweep at prefill sizes, then 8 Flash layers: decode B = 1 and prefill 8K with and without the wide MoE.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 240 python3 -m pytest -q --maxfail=6 -p no:cacheprovider tests/gpu/test_moe_wide.py tests/gpu/test_moe.py tests/gpu/test_model_gpu.py tests/gpu/test_moe_gemv_mma.py 2>&1 | grep -vE "^[.s]+ *\[" | tail -12
timeout 170 python3 bench/bench_gemm_moe.py --only moe --models flash --ms 1024,4096,8192 --out $OUT/moe 2>&1 | grep -E "^moe"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/outs") + "/moe/bench.json"))
for r in d["moe"]:
    print(r["model"], r["m"], {k[:-3]: round(v, 1) for k, v in r.items() if k.endswith("_us") and isinstance(v, float)})
PY
timeout 90 python3 bench/bench_parallel.py --world 1 --layers 8 --reps 6 --cuda-graphs --batches 1 --kv-dtype fp8 \
    --prefill 8192 --json $OUT/step.json 2>&1 | grep -E "B=|prefill|copy"
echo "--- same prefill, wide MoE off"
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 timeout 80 python3 - <<'PY' 2>&1 | grep -E "prefill"
import runpy, sys
import dsv4.kernels.moe_config as c
c.WIDE_MIN_PAIRS_PER_EXPERT = float("inf")
sys.argv = ["bench_parallel.py", "--world", "1", "--layers", "8", "--reps", "2", "--batches", "1", "--kv-dtype", "fp8",
            "--prefill", "8192"]
runpy.run_path("bench/bench_parallel.py", run_name="__main__")
PY
