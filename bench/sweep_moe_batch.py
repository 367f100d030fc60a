"""Decode-sized routed MoE at batch 8-64 (issue #5: >= 75 % of copy bandwidth on the expert bytes touched):
the default (`pick_moe_config`) against the per-pair tensor-core kernel (`moe_gemv` method "mma") with one, two
and four pairs of an expert per program (dsv4.kernels.moe_gemv_pairs; 2 or 1 K blocks per loop step) at every
batch, Flash (or Pro) experts (random MXFP4 bytes), random top-6 routing per token.

Timing as `sweep_linear.py`: `--calls` MoE calls with different routings in one CUDA graph, µs per call, beside
the touched bytes at the copy bandwidth of the same run.

    python bench/sweep_moe_batch.py [--tokens 8,16,24,32,48,64,96,128] [--calls 8] [--model flash|pro] [--shared 0.5]
                                    [--wide 16,64] [--configs NAME:FIELD=V,...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gemm_moe import MOE, random_experts  # noqa: E402
from bench.sweep_linear import copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels.moe import fused_moe  # noqa: E402
from dsv4.kernels.moe_config import MoEConfig, pick_moe_config, wide_config  # noqa: E402
from dsv4.kernels.moe_gemv_pairs import pair_blocks  # noqa: E402

DEV = "cuda"
LIMIT = 10.0
GROUP = 2  # tokens per correlated group (`routing`)


def routing(m: int, e: int, k: int, gen: torch.Generator, shared: float = 0.0) -> torch.Tensor:
    """Top-k distinct experts per token. shared = 0: tokens independent (unrelated sequences); shared > 0: tokens
    come in groups of `GROUP` (one sequence's MTP verify, or neighbouring positions) whose router scores share that
    fraction of a common random score, so a group's tokens pick overlapping experts."""
    scores = torch.rand(m, e, generator=gen, device=DEV)
    if shared:
        common = torch.rand((m + GROUP - 1) // GROUP, e, generator=gen, device=DEV).repeat_interleave(GROUP, 0)[:m]
        scores = (1 - shared) * scores + shared * common
    return scores.topk(k, dim=-1).indices.to(torch.int32)


def per_pair(bn: int, pairs: int = 1, unroll: int = 2, stages: int = 3) -> MoEConfig:
    return MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=bn, gemv_mma=True,
                     gemv_unroll=unroll, gemv_stages=stages, gemv_pairs=pairs, warps1=8 if bn == 128 else 4)


def _config(fields: str) -> MoEConfig:
    """`--configs`' FIELD=V,... over the one-pair config"""
    values = {k: {"True": True, "False": False}.get(v, v) for k, v in (f.split("=") for f in fields.split(",") if f)}
    return dataclasses.replace(per_pair(64), **{k: v if isinstance(v, bool) else int(v) for k, v in values.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="8,16,24,32,48,64,96,128")
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--model", default="flash", choices=sorted(MOE))
    ap.add_argument("--shared", type=float, default=0.0, help="router-score fraction shared by each pair of tokens")
    ap.add_argument("--configs", nargs="*", default=None, help="instead of the fixed variants: NAME:FIELD=V,... "
                    "over the one-pair config (MoEConfig fields, ints or True/False), e.g. "
                    "'p2 s4:gemv_pairs=2,gemv_stages=4'")
    ap.add_argument("--wide", default="", help="also the prefill path's wide kernel (one wgmma chain over K, the FP4 "
                    "widening overlapped) with these token tiles, e.g. 16,64")
    args = ap.parse_args()
    e, d, i, k = MOE[args.model]
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s ({torch.cuda.get_device_name()}), {args.model} experts {e} x {d} x {i}",
          flush=True)
    experts = random_experts(e, d, i, "mxfp4")
    per_expert = (2 * i * d + d * i) // 2 * (1 + 1 / 32)  # weight codes + E8M0 scales
    variants = {"one pair": per_pair(64), "two pairs": per_pair(64, 2),
                "two pairs, 1 K block/step": per_pair(64, 2, 1),
                "four pairs, 1 K block/step": per_pair(64, 4, 1),
                "four pairs bn128, 1 K block/step": per_pair(128, 4, 1)}
    if args.configs is not None:
        variants = {name: _config(fields) for name, fields in (c.split(":", 1) for c in args.configs)}
    for bm in (int(b) for b in args.wide.split(",") if b):
        variants[f"wide, {bm}-token tiles"] = wide_config(bm)
    for m in (int(t) for t in args.tokens.split(",")):
        gen = torch.Generator(DEV).manual_seed(m)
        x = (torch.randn(m, d, device=DEV, generator=gen) * 2).to(torch.bfloat16)
        w = torch.rand(m, k, device=DEV, generator=gen).softmax(-1)
        idss = [routing(m, e, k, gen, args.shared) for _ in range(args.calls)]
        touched = sum(int(ids.unique().numel()) for ids in idss) / len(idss)
        floor = touched * per_expert / bw / 1e6
        cfg = pick_moe_config(m * k, e, hidden=d)
        blocks = {g: float(pair_blocks(idss[0].reshape(-1), e, g)[:, 0].ge(0).sum()) for g in (2, 4)}
        ref = fused_moe(x, idss[0], w, experts, LIMIT).float()
        t_def = graph_us([lambda ids=ids: fused_moe(x, ids, w, experts, LIMIT) for ids in idss])
        kind = (f"{cfg.gemv_pairs} pair(s) per program" if cfg.gemv else
                ("wide" if cfg.wide else f"per-group bm{cfg.bm}"))
        print(f"B={m}: {m * k} pairs, {touched:.0f} experts touched ({touched * per_expert / 1e6:.0f} MB, floor "
              f"{floor:.1f} µs); default ({kind}) {t_def:8.1f} µs = {100 * floor / t_def:3.0f} % of copy BW; "
              f"blocks of 2 / 4: {blocks[2]:.0f} / {blocks[4]:.0f}", flush=True)
        t_blk = graph_us([lambda ids=ids, g=g: pair_blocks(ids.reshape(-1), e, g) for ids in idss for g in (2, 4)])
        print(f"  pair_blocks alone: {t_blk:.1f} µs", flush=True)
        for name, c in variants.items():
            y = fused_moe(x, idss[0], w, experts, LIMIT, config=c).float()
            err = float((y - ref).norm() / ref.norm())
            t = graph_us([lambda ids=ids, c=c: fused_moe(x, ids, w, experts, LIMIT, config=c) for ids in idss])
            print(f"  {name:28s} {t:8.1f} µs = {100 * floor / t:3.0f} %  ({t_def / t:.2f}x default)  "
                  f"rel.diff {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
