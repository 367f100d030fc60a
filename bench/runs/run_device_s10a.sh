#!/bin/bash
# Prepared in session 9 for session 10's first call: the Gluon prefill MoE with the widening overlapped
# (dsv4.kernels.moe_wide_async, opt-in moe_wide.ASYNC): its GPU tests, then ms per Flash MoE call (L2 flushed)
# against the Triton wide kernel in one run, then 8 Flash layers' 8K prefill with it on (in-process override).
# Also the prefill attention's value tile taken from the key tile (prefill_attention.KV_ONE_LOAD): tests, sweep.
source "$(dirname "$0")/lib.sh"
run 150 tests/gpu/test_moe_wide.py
run 90 tests/gpu/test_prefill_attention.py
timeout 150 python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import random_experts, MOE
from dsv4.kernels import moe_wide
from dsv4.kernels.moe import fused_moe, MoEConfig
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
wide = lambda bm: MoEConfig(bm=bm, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, wide=True)
variants = [("triton bm128", False, False, 3, 128), ("reg bm128 s3", True, False, 3, 128),
            ("reg bm128 s2", True, False, 2, 128), ("smem bm128 s3", True, True, 3, 128),
            ("smem bm128 s4", True, True, 4, 128), ("smem bm64 s4", True, True, 4, 64), ("reg bm64 s3", True, False, 3, 64)]
print("M | " + " | ".join(v[0] for v in variants))
for m in (2048, 4096, 8192):
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
    w = torch.rand(m, k, device="cuda") + 0.1
    row, base = [], None
    for name, asyn, a_smem, st, bm in variants:
        moe_wide.ASYNC, moe_wide.ASYNC_A_SMEM, moe_wide.ASYNC_STAGES = asyn, a_smem, st
        try:
            y = fused_moe(x, ids, w, ex, config=wide(bm))
            base = y if base is None else base
            same = float((y == base).double().mean())
            def f():
                flush.zero_()
                fused_moe(x, ids, w, ex, config=wide(bm))
            t = triton.testing.do_bench(f, warmup=3, rep=30) - triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
            row.append(f"{t:.2f} ({same:.4f} same)")
        except Exception as ex_:
            row.append("ERR " + str(ex_)[:120])
    print(f"{m} | " + " | ".join(row))
PY
