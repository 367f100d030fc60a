#!/bin/bash
# (Needs commit 6ad49df: the FP8 option it measures was removed after this call, docs/benchmarks.md #5, session 9.)
# Session 9, call 2: the FP8-operand prefill MoE (moe_wide.WIDE_FP8: e2m1 -> e4m3 per 128-wide K block
# relative to the block's largest scale byte, 4 FP8 MMAs per block) -- its GPU tests, then ms per Flash MoE
# call side by side in one run: bf16 wide (f16 widening, the default since s9a) vs FP8 wide at 64 / 128-row
# tiles, the per-group kernel, and the FP8-expert kernel (Flash-Base, 2x the weight bytes) as a yardstick.
source "$(dirname "$0")/lib.sh"
run 120 tests/gpu/test_moe_wide.py
timeout 200 python3 - <<'PY'
import torch, triton
from bench.bench_gemm_moe import random_experts, MOE
from dsv4.kernels import moe_wide
from dsv4.kernels.moe import fused_moe, MoEConfig, large_batch_config
e, d, i, k = MOE["flash"]
ex = random_experts(e, d, i, "mxfp4")
ex8 = random_experts(e, d, i, "fp8")
flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
def wide(bm, st=3):
    return MoEConfig(bm=bm, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, num_stages=st, wide=True)
variants = [("bf16 wide bm128", False, wide(128), ex), ("fp8 wide bm64", True, wide(64), ex),
            ("fp8 wide bm128", True, wide(128), ex), ("fp8 wide bm64 s2", True, wide(64, 2), ex),
            ("fp8 wide bm128 s2", True, wide(128, 2), ex), ("per-group bm64", False, large_batch_config("fp8"), ex),
            ("FP8 experts", False, None, ex8)]
print("M | " + " | ".join(v[0] for v in variants))
for m in (1024, 4096, 8192):
    x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
    w = torch.rand(m, k, device="cuda") + 0.1
    row = []
    for name, fp8, cfg, experts in variants:
        moe_wide.WIDE_FP8 = fp8
        try:
            y = fused_moe(x, ids, w, experts, config=cfg)
            def f():
                flush.zero_()
                fused_moe(x, ids, w, experts, config=cfg)
            t = triton.testing.do_bench(f, warmup=3, rep=30) - triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
            row.append(f"{t:.2f}")
        except Exception as ex_:
            row.append("ERR " + str(ex_)[:80])
    flops = 2 * m * k * 3 * d * i
    print(f"{m} | " + " | ".join(row) + f" | ({flops / 1e12:.2f} TFLOP per call)")
# same values: FP8 wide vs bf16 wide on one input (both exact products; fp32 order differs)
m = 4096
x = torch.randn(m, d, device="cuda").to(torch.bfloat16)
ids = torch.rand(m, e, device="cuda").topk(k, dim=1).indices
w = torch.rand(m, k, device="cuda") + 0.1
moe_wide.WIDE_FP8 = False; a = fused_moe(x, ids, w, ex, config=wide(128)).float()
moe_wide.WIDE_FP8 = True; b = fused_moe(x, ids, w, ex, config=wide(128)).float()
print(f"fp8 vs bf16 wide at M=4096: rel diff {((a - b).norm() / a.norm()).item():.2e}, equal {(a == b).float().mean().item():.4f}")
PY
