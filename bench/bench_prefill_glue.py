"""Prefill-size glue kernels of a CSA / HCA / sliding layer at Flash shapes, one 8K prompt (issue #6):

* the indexer's selection (`Indexer.select_indices`): torch path vs kernel mode (`prefill_index_scores` +
  radix top-k), with the share of rows that pick the same set, and the scores launch alone;
* the indexer queries' RoPE + Hadamard + FP4 glue (`norm_rope` SIM_FP4);
* prefill attention (`prefill_attention`) per layer kind over launch shapes (dv, bn, warps, stages), each
  checked against the first shape (max abs difference).

    python bench/bench_prefill_glue.py [--tokens 8192] [--shapes 512,32,8,2 256,32,8,2 ...] [--kv-one-load]

Times: triton's do_bench (median, L2 not flushed). A development aid; docs/benchmarks.md cites the calls.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

HEADS, HEAD_DIM, WINDOW = 64, 512, 128  # Flash attention
INDEX_HEADS, INDEX_DIM, INDEX_TOPK = 64, 128, 512  # Flash indexer


def bench_select(t: int, gen: torch.Generator) -> None:
    import triton

    from dsv4.kernels.indexer_scores import prefill_index_scores
    from dsv4.model.indexer import Indexer

    n = t // 4
    q = torch.randn(t, INDEX_HEADS, INDEX_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(t, INDEX_HEADS, device="cuda", generator=gen) * (INDEX_DIM * INDEX_HEADS) ** -0.5
    w = w.to(torch.bfloat16)
    keys = torch.randn(n, INDEX_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    pos = torch.arange(t, device="cuda")
    ix = Indexer.__new__(Indexer)
    torch.nn.Module.__init__(ix)
    ix.topk, ix.ratio = INDEX_TOPK, 4
    picks = {}
    for mode in (False, True):
        ix.use_kernels = mode
        picks[mode] = ix.select_indices(q, w, keys, pos)
        ms = triton.testing.do_bench(lambda: ix.select_indices(q, w, keys, pos), warmup=2, rep=20)
        print(f"select_indices T={t} N={n} Hi={INDEX_HEADS} kernels={mode}: {ms:.2f} ms")
    big = torch.iinfo(torch.long).max
    a, b = (torch.where(p < 0, big, p).sort(1).values for p in (picks[False], picks[True]))
    print(f"rows with the same set: {(a == b).all(1).float().mean().item():.4f}")
    vis = ((pos + 1) // 4).to(torch.int32)
    ms = triton.testing.do_bench(lambda: prefill_index_scores(q, w, keys, vis), warmup=2, rep=20)
    flop = t * n * INDEX_HEADS * INDEX_DIM  # 2 per multiply-add, over the visible half
    print(f"  of which scores: {ms:.2f} ms ({flop / ms / 1e9:.0f} TFLOP/s on the visible half)")


def bench_index_queries(t: int, gen: torch.Generator) -> None:
    import triton

    from dsv4.kernels import norm_rope as nr

    x = torch.randn(t, INDEX_HEADS, INDEX_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    cos = torch.rand(t, 32, device="cuda", generator=gen)
    sin = torch.rand(t, 32, device="cuda", generator=gen)
    ms = triton.testing.do_bench(lambda: nr.norm_rope(x, cos=cos, sin=sin, sim=nr.SIM_FP4), warmup=3, rep=20)
    print(f"indexer q glue [{t}, {INDEX_HEADS}, {INDEX_DIM}]: {ms:.3f} ms")


def attention_cases(t: int, gen: torch.Generator) -> dict:
    """Entries and per-query lists of a CSA layer (512 causal picks), an HCA layer (every complete entry) and
    a sliding layer (none)."""
    dev = "cuda"
    vis = (torch.arange(t, device=dev) + 1) // 4
    r = torch.rand(t, t // 4, device=dev, generator=gen)
    r = r.masked_fill(torch.arange(t // 4, device=dev)[None, :] >= vis[:, None], -1)
    top = r.topk(min(INDEX_TOPK, t // 4), dim=1)
    idx_csa = torch.where(top.values >= 0, top.indices, -1).sort(1).values
    every = torch.arange(t // 128, device=dev)[None, :]
    idx_hca = torch.where(every < ((torch.arange(t, device=dev) + 1) // 128)[:, None], every, -1)
    entries = {k: torch.randn(n, HEAD_DIM, device=dev, generator=gen).to(torch.bfloat16)
               for k, n in (("CSA", t // 4), ("HCA", t // 128))}
    return {"CSA": (entries["CSA"], idx_csa), "HCA": (entries["HCA"], idx_hca), "SWA": (None, None)}


def bench_attention(t: int, shapes: list, gen: torch.Generator) -> None:
    """shapes: (dv, bn, warps, stages) of the Triton kernel, or None for the Gluon kernel (`GLUON`)."""
    import triton

    from dsv4.kernels import prefill_attention as pa

    q = torch.randn(t, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    keys = torch.randn(t, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    sink = torch.randn(HEADS, device="cuda", generator=gen)
    print("layer | " + " | ".join("gluon" if s is None else "dv{} bn{} w{} s{}".format(*s) for s in shapes)
          + "   (ms, max abs diff)")
    for name, (e, idx) in attention_cases(t, gen).items():
        row, base = [], None
        for shape in shapes:
            def call(shape=shape):
                pa.GLUON = shape is None
                dv, bn, w, st = shape or (None,) * 4
                return pa.prefill_attention(q, 0, keys, 0, WINDOW, e, idx, sink, 0.044, dv=dv, bn=bn, num_warps=w,
                                            num_stages=st)
            try:
                o = call()
                base = o if base is None else base
                err = (o.float() - base.float()).abs().max().item()
                row.append(f"{triton.testing.do_bench(call, warmup=2, rep=10):.2f} ({err:.0e})")
            except Exception as ex:  # a shape past the shared-memory limit: reported, not fatal
                row.append("ERR " + str(ex)[:60])
        print(f"{name} | " + " | ".join(row))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--shapes", nargs="*", default=["512,32,8,2", "256,32,8,2"],
                   help="prefill attention launch shapes dv,bn,warps,stages or gluon (the first is the reference)")
    p.add_argument("--skip", nargs="*", default=[], choices=["select", "queries", "attention"])
    p.add_argument("--kv-one-load", action="store_true", help="prefill_attention.KV_ONE_LOAD (value tile = key tile)")
    args = p.parse_args()
    if args.kv_one_load:
        from dsv4.kernels import prefill_attention
        prefill_attention.KV_ONE_LOAD = True
    gen = torch.Generator("cuda").manual_seed(0)
    if "select" not in args.skip:
        bench_select(args.tokens, gen)
    if "queries" not in args.skip:
        bench_index_queries(args.tokens, gen)
    if "attention" not in args.skip:
        bench_attention(args.tokens, [None if s == "gluon" else tuple(int(v) for v in s.split(","))
                                      for s in args.shapes], gen)


if __name__ == "__main__":
    main()
