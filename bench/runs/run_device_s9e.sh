#!/bin/bash
# Session 9, call 5: the prefill MoE (bf16 wide) with 64-row tiles capped at 128 registers (2 CTAs per SM, so one
# CTA's CUDA-core widening can overlap the other's wgmma) vs the 128-row default; Flash MoE call, L2 flushed.
# Then the 8K prefill's kernels per layer (4 Flash layers SWA/SWA/CSA/HCA): attention and MoE by layer kind.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/outs}; mkdir -p $OUT
timeout 200 python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import random_experts, MOE
from dsv4.kernels.moe import fused_moe, MoEConfig
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
def wide(bm, warps=8, st=3, reg=0):
    return MoEConfig(bm=bm, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=warps, num_stages=st, wide=True,
                     maxnreg=reg)
variants = [("bm128 w8 s3 (default)", wide(128)), ("bm64 w8 s3 r128", wide(64, reg=128)),
            ("bm64 w8 s2 r128", wide(64, st=2, reg=128)), ("bm64 w8 s4 r128", wide(64, st=4, reg=128)),
            ("bm64 w8 s3", wide(64)), ("bm128 w8 s2 r168", wide(128, st=2, reg=168))]
print("M | " + " | ".join(v[0] for v in variants))
ref = {}
for m in (2048, 4096, 8192):
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
    w = torch.rand(m, k, device="cuda") + 0.1
    row = []
    base = None
    for name, cfg in variants:
        try:
            y = fused_moe(x, ids, w, ex, config=cfg)
            if base is None:
                base = y
            same = torch.equal(y, base)
            def f():
                flush.zero_()
                fused_moe(x, ids, w, ex, config=cfg)
            t = triton.testing.do_bench(f, warmup=3, rep=30) - triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
            row.append(f"{t:.2f}{'' if same else ' (differs!)'}")
        except Exception as ex_:
            row.append("ERR " + str(ex_)[:100])
    print(f"{m} | " + " | ".join(row))
PY
timeout 120 python3 bench/profile_step.py --layers 4 --prefill 8192 --order 2>&1 | grep -v -i warn > $OUT/order.txt
grep -E "^-- |_prefill_attn|_wide_kernel|_fp8_gemm|_norm_rope|_mix_kernel|nvjet" $OUT/order.txt | head -80
