"""Run the kernels that dominate a Flash decode step and an 8K prefill once each, for Nsight Compute.

    ncu -k regex:"_mma_glu|_mma_down|_wide_async|_mix_kernel|_grouped_w8a16|_fp8_gemm" \\
        --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \\
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio \\
        python bench/ncu_kernels.py

Each op runs twice (compile, then the profiled launch is the second; profile with `--launch-skip` per kernel
or read the second entry). Shapes: Flash (routed experts MXFP4 256 x 4096 x 2048, top 6), decode at one
token, prefill at `--tokens` tokens, random weights on the GPU; `--only glue`: decode attention and the mHC
site at one token.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gemm_moe import random_experts  # noqa: E402
from dsv4.kernels import mhc  # noqa: E402
from dsv4.kernels.fp8_linear import fp8_linear  # noqa: E402
from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16  # noqa: E402
from dsv4.kernels.moe import fused_moe  # noqa: E402

DEV = "cuda"


def _decode_glue() -> list:
    """Decode attention at B = 1, ctx 4K (sliding; CSA with 512 picked entries) and the mHC sites at T = 1."""
    from bench.bench_glue import _fp8_pool
    from dsv4.kernels.attention import decode_attention
    g = torch.Generator(device=DEV).manual_seed(1)
    ps, ring, n = 64, 256, 1024
    wpool, cpool = _fp8_pool(ring // ps + 1, ps, DEV, g), _fp8_pool(n // ps + 1, ps, DEV, g)
    wtab = torch.randperm(ring // ps, device=DEV, generator=g).view(1, -1)
    ctab = torch.randperm(n // ps, device=DEV, generator=g).view(1, -1)
    idx = torch.randperm(n, device=DEV, generator=g)[:512].sort().values.view(1, -1)
    q = torch.randn(1, 64, 512, device=DEV, generator=g).to(torch.bfloat16)
    pos, sink = torch.full((1,), 4095, device=DEV), torch.randn(64, device=DEV, generator=g)
    fn = mhc.prepare_mix(torch.randn(24, 4 * 4096, device=DEV) * 0.02)
    base, scale = torch.randn(24, device=DEV) * 0.1, torch.rand(3, device=DEV) + 0.5
    hx = torch.randn(1, 4, 4096, device=DEV).to(torch.bfloat16)
    hf = torch.randn(1, 4096, device=DEV).to(torch.bfloat16)
    post, comb = torch.rand(1, 4, device=DEV) * 2, torch.rand(1, 4, 4, device=DEV) / 4
    nw = (torch.rand(4096, device=DEV) + 0.5).to(torch.bfloat16)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6, norm_weight=nw)
    return [("decode attention sliding", lambda: decode_attention(q, pos, None, None, wpool, wtab, ring, 128, None,
                                                                  None, None, None, sink, 512 ** -0.5)),
            ("decode attention CSA", lambda: decode_attention(q, pos, None, None, wpool, wtab, ring, 128, cpool, ctab,
                                                              idx, None, sink, 512 ** -0.5)),
            ("decode hc_post_pre", lambda: mhc.hc_post_pre(hf, hx, post, comb, fn, base, scale, **kw))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--only", default="decode,prefill")
    args = ap.parse_args()
    parts = args.only.split(",")
    ex = random_experts(256, 4096, 2048, "mxfp4")
    ops = []
    if "decode" in parts:
        x1 = torch.randn(1, 4096, device=DEV).to(torch.bfloat16)
        ids1 = torch.randperm(256, device=DEV)[:6].view(1, 6)
        w1 = torch.rand(1, 6, device=DEV) + 0.1
        ops.append(("decode MoE", lambda: fused_moe(x1, ids1, w1, ex)))
        wq = (torch.randn(32768, 1024, device=DEV) * 0.5).to(torch.float8_e4m3fn)
        sq = torch.randint(118, 125, (256, 8), device=DEV, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        xq = torch.randn(1, 1024, device=DEV).to(torch.bfloat16)
        ops.append(("decode wq_b", lambda: fp8_linear(xq, wq, sq)))
        wa = (torch.randn(8192, 4096, device=DEV) * 0.5).to(torch.float8_e4m3fn)
        sa = torch.randint(118, 125, (64, 32), device=DEV, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        xa = torch.randn(1, 8, 4096, device=DEV).to(torch.bfloat16)
        ops.append(("decode wo_a", lambda: grouped_linear_w8a16(xa, wa, sa)))
        wb = (torch.randn(4096, 8192, device=DEV) * 0.5).to(torch.float8_e4m3fn)
        sb = torch.randint(118, 125, (32, 64), device=DEV, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        xb = torch.randn(1, 8192, device=DEV).to(torch.bfloat16)
        ops.append(("decode wo_b", lambda: fp8_linear(xb, wb, sb)))
    if "glue" in parts:  # the latency-bound kernels of a B = 1 decode layer
        ops += _decode_glue()
    if "prefill" in parts:
        t = args.tokens
        x = torch.randn(t, 4096, device=DEV).to(torch.bfloat16)
        ids = torch.rand(t, 256, device=DEV).topk(6, dim=1).indices
        w = torch.rand(t, 6, device=DEV) + 0.1
        ops.append(("prefill MoE", lambda: fused_moe(x, ids, w, ex)))
        fn = mhc.prepare_mix(torch.randn(24, 4 * 4096, device=DEV) * 0.02)
        base, scale = torch.randn(24, device=DEV) * 0.1, torch.rand(3, device=DEV) + 0.5
        hx = torch.randn(t, 4, 4096, device=DEV).to(torch.bfloat16)
        hf = torch.randn(t, 4096, device=DEV).to(torch.bfloat16)
        post, comb = torch.rand(t, 4, device=DEV) * 2, torch.rand(t, 4, 4, device=DEV) / 4
        nw = (torch.rand(4096, device=DEV) + 0.5).to(torch.bfloat16)
        ops.append(("prefill hc_post_pre", lambda: mhc.hc_post_pre(hf, hx, post, comb, fn, base, scale,
                                                                   sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6,
                                                                   norm_weight=nw)))
    for name, op in ops:
        for _ in range(2):
            op()
        torch.cuda.synchronize()
        print(f"ran {name}", flush=True)


if __name__ == "__main__":
    main()
