#!/bin/bash
# Prepared in session 8 (its device time was spent) for the next session's first call: the f16 widening of
# the prefill MoE (moe_wide.WIDEN_F16, opt-in): its exhaustive widening table and fused_moe tests, then fp32
# vs f16 widening at M = 4096 / 8192 (flip the default if f16 wins).
export PYTHONUNBUFFERED=1
timeout 50 python3 -m pytest -q -rf --tb=line -p no:cacheprovider tests/gpu/test_moe_wide.py -k "widen or True" 2>&1 \
    | grep -E "passed|failed|FAILED" | tail -6
timeout 60 python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import random_experts, MOE
from dsv4.kernels import moe_wide
from dsv4.kernels.moe import fused_moe
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
for m in (4096, 8192):
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
    w = torch.rand(m, k, device="cuda") + 0.1
    row = []
    for f16 in (False, True, False, True):
        moe_wide.WIDEN_F16 = f16
        fused_moe(x, ids, w, ex)
        row.append(triton.testing.do_bench(lambda: fused_moe(x, ids, w, ex), warmup=5, rep=40))
    print(f"M={m}: fp32 widening {row[0]:.2f} / {row[2]:.2f} ms, f16 widening {row[1]:.2f} / {row[3]:.2f} ms")
PY
