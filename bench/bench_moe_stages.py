"""The decode MoE's two GEMVs timed alone at Flash's expert shape, each against the bytes it must read: the Triton
GLU / down of method "mma" (`moe_gemv.mma_glu_stage` / `mma_down_stage`, the launch `pick_moe_config` picks) and the
persistent Gluon kernel (`moe_glu_decode.glu_decode` / `down_decode`), one pair per program, random experts.

µs per call of `--calls` calls with different routings replayed from one CUDA graph (`sweep_linear.graph_us`; the
weights of the calls exceed L2); GB/s of the expert bytes the pairs touch (codes and scales) and their share of the
copy bandwidth measured in the same run -- issue #5's MoE decode measure (target >= 75 %).

    python bench/bench_moe_stages.py [--tokens 1,2,4] [--calls 16]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gemm_moe import MOE, random_experts  # noqa: E402
from bench.sweep_linear import copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels import moe_glu_decode  # noqa: E402
from dsv4.kernels.moe_config import pick_moe_config  # noqa: E402
from dsv4.kernels.moe_gemv import _quant16_kernel, mma_down_stage, mma_glu_stage  # noqa: E402

DEV = "cuda"
LIMIT = 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--calls", type=int, default=16)
    args = ap.parse_args()
    e, d, i, k = MOE["flash"]
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    experts = random_experts(e, d, i, "mxfp4")
    gen = torch.Generator(DEV).manual_seed(0)
    for m in (int(t) for t in args.tokens.split(",")):
        pairs = m * k
        x = (torch.randn(m, d, device=DEV, generator=gen) * 2).to(torch.bfloat16)
        xq = torch.empty((m, d), dtype=torch.float16, device=DEV)
        sx = torch.empty((m, d // 128), dtype=torch.float32, device=DEV)
        _quant16_kernel[(m, d // 128)](x, xq, sx, x, e, x.stride(0), xq.stride(0), sx.stride(0), CHECK_IDS=False,
                                       num_warps=1)
        tw = torch.rand(pairs, device=DEV, generator=gen)
        idss = [torch.randperm(e, generator=gen, device=DEV)[:pairs].to(torch.int32) for _ in range(args.calls)]
        zq = torch.empty((pairs, i), dtype=torch.float16, device=DEV)
        zs = torch.empty((pairs, i // 128), dtype=torch.float32, device=DEV)
        y = torch.empty((pairs, d), dtype=torch.bfloat16, device=DEV)
        cfg = pick_moe_config(pairs, e)
        launch = dict(bn=cfg.gemv, num_warps=cfg.warps1, unroll=cfg.gemv_unroll, num_stages=cfg.gemv_stages)
        glu_bytes = pairs * (2 * i * d // 2) * (1 + 1 / 16)  # codes + one E8M0 byte per 32
        down_bytes = pairs * (d * i // 2) * (1 + 1 / 16)

        glu_calls = [lambda ids=ids: mma_glu_stage(x, ids, tw, experts, LIMIT, k, zq, zs, split=cfg.gemv_split,
                                                   x_quant=(xq, sx), **launch) for ids in idss]
        rows = []
        for name, gluon in (("GLU Triton", False), ("GLU Gluon", True)):
            old = moe_glu_decode.ENABLED
            moe_glu_decode.ENABLED = gluon  # (read at every call, so also while capturing)
            try:
                rows.append((name, graph_us(glu_calls), glu_bytes))
            finally:
                moe_glu_decode.ENABLED = old
        mma_glu_stage(x, idss[0], tw, experts, LIMIT, k, zq, zs, x_quant=(xq, sx), **launch)  # (a valid z)
        rows.append(("down Triton", graph_us([lambda ids=ids: mma_down_stage(
            zq, zs, ids, experts, y, split=cfg.gemv_split_down, **launch) for ids in idss]), down_bytes))
        rows.append(("down Gluon", graph_us([lambda ids=ids: moe_glu_decode.down_decode(zq, zs, ids, experts)
                                             for ids in idss]), down_bytes))
        for name, us, nbytes in rows:
            print(f"M={m:2d} {name:12s} {us:7.2f} µs  {nbytes / 1e6:6.1f} MB  {nbytes / us / 1e3:6.0f} GB/s  "
                  f"{100 * nbytes / us / 1e6 / bw:5.1f} % of copy", flush=True)


if __name__ == "__main__":
    main()
