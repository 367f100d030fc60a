#!/bin/bash
# Session 9, call 1: GPU tests of the commits after s8e (the `_block_pairs` refactor, the wide fallback to
# large_batch_config, decode_step_rows, f16 widening through moe_gemv's bit moves), then the prepared A/B:
# fp32 vs f16 widening of the prefill MoE (moe_wide.WIDEN_F16) at M = 4096 / 8192.
source "$(dirname "$0")/lib.sh"
run 150 tests/gpu/test_moe_wide.py tests/gpu/test_moe.py
run 160 tests/gpu/test_model_gpu.py
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
