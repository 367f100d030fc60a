#!/bin/bash
# Prepared in session 10 for session 11's first call: the Gluon MoE with one warpgroup per program
# (moe_wide.ASYNC_ONE_WARPGROUP: 64 weight rows, 4 warps, two programs per SM; z quantised afterwards by
# requant_rows) -- its tests, the per-GEMM launch-shape table, the whole MoE call against the default, and
# 8 Flash layers' 8K prefill with it on (in-process override) and off.
source "$(dirname "$0")/lib.sh"
run 150 tests/gpu/test_moe_wide.py
timeout 150 python3 bench/bench_moe_wide_shapes.py --ms 4096,8192
timeout 60 python3 bench/bench_moe_wide_shapes.py --ms 2048 --bm 64 --shapes 128,8,reg,4 64,4,reg,4 64,4,reg,3
timeout 120 python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import random_experts, MOE
from dsv4.kernels import moe_wide
from dsv4.kernels.moe import fused_moe
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
t0 = triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
print("M | default ms | one warpgroup ms | same")
for m in (2048, 4096, 8192):
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
    w = torch.rand(m, k, device="cuda") + 0.1
    row, outs = [], []
    for one in (False, True):
        moe_wide.ASYNC_ONE_WARPGROUP = one
        outs.append(fused_moe(x, ids, w, ex))
        def f():
            flush.zero_()
            fused_moe(x, ids, w, ex)
        row.append(triton.testing.do_bench(f, warmup=3, rep=30) - t0)
    print(f"{m} | {row[0]:.2f} | {row[1]:.2f} | {float((outs[0] == outs[1]).double().mean()):.4f}", flush=True)
PY
for one in True False; do
echo "--- 8K prefill of 8 Flash layers, ASYNC_ONE_WARPGROUP = $one"
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29518 ONE=$one timeout 100 python3 - <<'PY' 2>&1 | grep -E "prefill|copy"
import os, runpy, sys
import dsv4.kernels.moe_wide as mw
mw.ASYNC_ONE_WARPGROUP = os.environ["ONE"] == "True"
sys.argv = ["bench_parallel.py", "--world", "1", "--layers", "8", "--reps", "2", "--batches", "1", "--kv-dtype", "fp8",
            "--prefill", "8192"]
runpy.run_path("bench/bench_parallel.py", run_name="__main__")
PY
done
