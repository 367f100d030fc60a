"""Decode-step glue kernels timed inside CUDA graphs (20 calls per graph, so launch gaps count as they
do in a captured step). A development aid for issue #6:

* mHC pre / post+pre / HC head (no Sinkhorn) at decode sizes, for this tree's `dsv4.kernels.mhc` and,
  side by side, a baseline copy of that module (`--baseline path/to/mhc.py`, e.g. the last commit's);
  checks that both give the same post/comb and nearly the same u; last column: this tree with
  `collapse="split"` (the finish's collapse split over D).
* decode attention (Flash shapes: 64 heads x 512, window 128) for sliding, CSA (512 picked entries)
  and HCA rows at several split counts (`--attn`), checked against the one-split result.
* the attention input's bf16 projections (`--proj`, Flash CSA and HCA shapes): cuBLAS GEMM + the
  `finish_projections` launch vs the one-launch `project_decode` (`projections.DECODE_GEMV`, the default),
  at its default tiling and a few others.

* the greedy pick over the Flash vocabulary (`--argmax`): torch's argmax vs `first_argmax`.
* the MoE router's one-launch logits GEMV + top-k (`--router`, Flash: 256 experts x 4096, k = 6; bias and hash
  layers).
* the attention input's norm / RoPE launches at decode (`--norm`, Flash: the q latent + kv pair, the 64 query
  heads) with `norm_rope.ROPE_FIRST` off and on, checked to give the same bits.

    python bench/bench_glue.py [--baseline /tmp/mhc_base.py] [--tokens 1,8,64] [--attn] [--proj] [--argmax]
                               [--router] [--norm]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))  # bench_e2e's graph timer

CALLS = 20


def graph_us(fn, reps: int = 20, calls: int = CALLS) -> float:
    """Microseconds per call of `fn`, captured `calls` times in one graph (bench_e2e.graph_ms: median replay)."""
    from bench_e2e import graph_ms

    def many() -> None:
        for _ in range(calls):
            fn()
    return graph_ms(many, reps) * 1e3 / calls


def _load(path: str):
    spec = importlib.util.spec_from_file_location("mhc_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--baseline", default="")
    p.add_argument("--tokens", default="1,8,64")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--attn", action="store_true", help="also sweep decode attention's split count")
    p.add_argument("--proj", action="store_true", help="also time the two projection paths")
    p.add_argument("--argmax", action="store_true", help="also time the greedy pick: torch's argmax vs first_argmax")
    p.add_argument("--router", action="store_true", help="time the router at --tokens instead")
    p.add_argument("--norm", action="store_true", help="time the decode norm / RoPE launches at --tokens instead")
    args = p.parse_args()
    if args.norm:
        return norm_rope_variants(int(v) for v in args.tokens.split(","))
    if args.router:
        return router_timings(int(v) for v in args.tokens.split(","))
    if args.argmax:
        greedy_pick()
    if args.proj:
        projection_paths()
    if args.attn:
        attention_splits()
    from dsv4.kernels import mhc
    mods = {"this tree": mhc}
    if args.baseline:
        mods["baseline"] = _load(args.baseline)
    d, dev = args.hidden, torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    fn = torch.randn(24, 4 * d, device=dev, generator=g) * 0.02
    base, scale = torch.randn(24, device=dev, generator=g) * 0.1, torch.rand(3, device=dev, generator=g) + 0.5
    norm_w = (torch.rand(d, device=dev, generator=g) + 0.5).to(torch.bfloat16)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6, norm_weight=norm_w)
    print(f"mHC glue, hidden {d}, µs per call inside a CUDA graph ({CALLS} calls per graph)")
    print(f"{'op':14s} {'T':>5} " + " ".join(f"{n:>12s}" for n in mods) + f" {'tree split':>12s}")
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, 4, d, device=dev, generator=g).to(torch.bfloat16)
        f = torch.randn(t, d, device=dev, generator=g).to(torch.bfloat16)
        post = torch.rand(t, 4, device=dev, generator=g) * 2
        comb = torch.rand(t, 4, 4, device=dev, generator=g) / 4
        outs, row_pre, row_pp, row_head = [], [], [], []
        for name, m in mods.items():
            w = m.prepare_mix(fn)
            outs.append(m.hc_pre(x, w, base[:24], scale, **kw))
            row_pre.append(graph_us(lambda: m.hc_pre(x, w, base, scale, **kw)))
            row_pp.append(graph_us(lambda: m.hc_post_pre(f, x, post, comb, w, base, scale, **kw)))
            wh = m.prepare_mix(fn[:4])
            row_head.append(graph_us(lambda: m.hc_head(x, wh, base[:4], scale[:1], hc_eps=1e-6, norm_eps=1e-6,
                                                       norm_weight=norm_w)))
        if len(outs) == 2:
            (u0, p0, c0), (u1, p1, c1) = outs
            # the mixes may be summed in another fp32 order (the CUDA-core mix at decode sizes, session 19)
            assert torch.allclose(p0, p1, rtol=1e-5, atol=0) and torch.allclose(c0, c1, rtol=1e-4, atol=1e-7), \
                "post/comb differ"
            du = (u0.float() - u1.float()).abs().max().item()
            assert du <= 2 ** -6 * u0.float().abs().max().item(), f"u differs by {du}"
        # this tree's finish with the collapse split over D (same post/comb, normed u up to rare 1-ulp flips)
        ws, whs, sk = mhc.prepare_mix(fn), mhc.prepare_mix(fn[:4]), dict(kw, collapse="split")
        us, ps, cs = mhc.hc_pre(x, ws, base, scale, **sk)
        assert torch.equal(ps, outs[0][1]) and torch.equal(cs, outs[0][2]), "split post/comb differ"
        du = (us.float() - outs[0][0].float()).abs().max().item()
        assert du <= 2 ** -6 * us.float().abs().max().item(), f"split u differs by {du}"
        row_pre.append(graph_us(lambda: mhc.hc_pre(x, ws, base, scale, **sk)))
        row_pp.append(graph_us(lambda: mhc.hc_post_pre(f, x, post, comb, ws, base, scale, **sk)))
        row_head.append(graph_us(lambda: mhc.hc_head(x, whs, base[:4], scale[:1], hc_eps=1e-6, norm_eps=1e-6,
                                                     norm_weight=norm_w, collapse="split")))
        print(f"{'hc_pre':14s} {t:5d} " + " ".join(f"{v:12.2f}" for v in row_pre))
        print(f"{'hc_post_pre':14s} {t:5d} " + " ".join(f"{v:12.2f}" for v in row_pp))
        print(f"{'hc_head':14s} {t:5d} " + " ".join(f"{v:12.2f}" for v in row_head))


def router_timings(tokens) -> None:
    """µs per `gate_route` call (Flash shapes) for a bias layer and a hash layer."""
    from dsv4.kernels import router
    dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(3)
    e, d, k = 256, 4096, 6
    w = (torch.randn(e, d, device=dev, generator=g) * 0.03).to(torch.bfloat16)
    bias = torch.randn(e, device=dev, generator=g) * 0.1
    t2e = torch.stack([torch.randperm(e, device=dev, generator=g)[:k] for _ in range(1000)])
    print("router gate_route (256 experts x 4096, k = 6), µs per call in a CUDA graph")
    for t in tokens:
        x = torch.randn(t, d, device=dev, generator=g).to(torch.bfloat16)
        tok = torch.randint(0, 1000, (t,), device=dev, generator=g)
        for kind, kw in (("bias", dict(bias=bias)), ("hash", dict(tid2eid=t2e, token_ids=tok))):
            router.gate_route(x, w, k, route_scale=2.5, **kw)  # compiles, allocates the counters
            us = graph_us(lambda: router.gate_route(x, w, k, route_scale=2.5, **kw))
            print(f"{kind:5s} T={t:3d} {us:7.2f}")


def norm_rope_variants(tokens) -> None:
    """µs per decode norm / RoPE launch (Flash shapes: q latent 1024 + kv 512 paired, 64 query heads x 512; RoPE on
    the last 64 dims) with norm_rope.ROPE_FIRST off / on; the same bits either way."""
    from dsv4.kernels import norm_rope as nr
    dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(4)
    wq, wkv = ((torch.rand(n, device=dev, generator=g) + 0.5).to(torch.bfloat16) for n in (1024, 512))
    print("decode norm / RoPE, µs per call in a CUDA graph, ROPE_FIRST off / on")
    for t in tokens:
        ql = torch.randn(t, 1024, device=dev, generator=g).to(torch.bfloat16)
        kv = torch.randn(t, 512, device=dev, generator=g).to(torch.bfloat16)
        q = torch.randn(t, 64, 512, device=dev, generator=g).to(torch.bfloat16)
        ang = torch.rand(t, 32, device=dev, generator=g) * 6.28
        cos, sin = ang.cos(), ang.sin()
        calls = {"q latent + kv": lambda: nr.norm_rope_two(
                     ql, dict(norm=nr.WEIGHTED, weight=wq, eps=1e-6), kv,
                     dict(norm=nr.WEIGHTED, weight=wkv, eps=1e-6, cos=cos, sin=sin, sim=nr.SIM_FP8, nope=448)),
                 "query heads": lambda: nr.norm_rope(q, norm=nr.UNWEIGHTED, eps=1e-6, cos=cos, sin=sin)}
        for name, fn in calls.items():
            row, want = [], None
            for first in (False, True):
                nr.ROPE_FIRST = first
                got = fn()
                got = got if isinstance(got, tuple) else (got,)
                want = want or got
                assert all(torch.equal(a, b) for a, b in zip(got, want)), (name, t)
                row.append(graph_us(fn))
            print(f"{name:14s} T={t:3d} " + " ".join(f"{v:7.2f}" for v in row))
    nr.ROPE_FIRST = False


def projection_paths() -> None:
    """µs per call: cuBLAS GEMM into fp32 + `finish_projections` vs `project_decode` (default tiling,
    then (block_n, k_slice) variants), Flash CSA (main 2x512 overlap, indexer 2x128, 64 head weights)
    and HCA (main 512) weights, checked against each other."""
    from dsv4.kernels import projections as pj
    from dsv4.model.linear import bf16_gemm_fp32
    dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(2)
    tilings = [(16, 1024), (32, 512), (32, 2048), (64, 1024)]
    print("attention-input projections, µs per call in a CUDA graph: cuBLAS + finish | project_decode "
          "(default, then block_n/k_slice " + ", ".join(f"{b}/{k}" for b, k in tilings) + ")")
    for kind, width, iwidth, ratio, heads in (("CSA", 1024, 256, 4, 64), ("HCA", 512, 0, 128, 0)):
        n = 2 * width + 2 * iwidth + heads
        weight = (torch.randn(n, 4096, device=dev, generator=g) * 0.02).to(torch.bfloat16)
        gates = [(width, torch.randn(ratio, width, device=dev, generator=g) * 0.1)]
        if iwidth:
            gates.append((2 * width + iwidth, torch.randn(ratio, iwidth, device=dev, generator=g) * 0.1))
        head = (2 * width + 2 * iwidth, heads, 64 ** -0.5) if heads else None
        for t in (1, 4, 16):
            a = torch.randn(t, 4096, device=dev, generator=g).to(torch.bfloat16)
            pos = torch.randint(0, 4096, (t,), device=dev, generator=g)

            def two():
                y = bf16_gemm_fp32(a, weight)
                return y, pj.finish_projections(y, pos, gates, head)
            y2, _ = two()
            y1, _ = pj.project_decode(a, weight, pos, gates, head)  # also allocates the counters
            err = ((y1 - y2).abs().max() / y2.abs().max()).item()
            assert err < 1e-5, f"{kind} T={t}: the paths differ by {err:.1e} (relative to the largest output)"
            row = [graph_us(two), graph_us(lambda: pj.project_decode(a, weight, pos, gates, head))]
            for bn, ks in tilings:
                pj.project_decode(a, weight, pos, gates, head, block_n=bn, k_slice=ks)
                row.append(graph_us(lambda: pj.project_decode(a, weight, pos, gates, head, block_n=bn, k_slice=ks)))
            print(f"{kind:4s} N={n:5d} T={t:3d} " + " ".join(f"{v:7.1f}" for v in row))


def _fp8_pool(pages: int, ps: int, dev, g):
    from types import SimpleNamespace
    q = (torch.randn(pages, ps, 448, device=dev, generator=g) * 4).to(torch.float8_e4m3fn)
    s = torch.randint(120, 130, (pages, ps, 7), device=dev, generator=g, dtype=torch.int32).to(torch.uint8)
    rope = torch.randn(pages, ps, 64, device=dev, generator=g).to(torch.bfloat16)
    return SimpleNamespace(q=q, s=s, rope=rope)


def attention_splits() -> None:
    """µs per decode_attention call at B = 1 and 8, ctx 4K, for split counts around the default (wide
    combine), and at the default split count with the loop combine (last column)."""
    from dsv4.kernels.attention import decode_attention
    dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(1)
    ctx, ps, ring = 4096, 64, 256
    print(f"decode attention, 64 heads x 512, ctx {ctx}: µs per call in a CUDA graph, by split count")
    print(f"{'kind':8s} {'B':>3} " + " ".join(f"{'auto' if v is None else v:>7}" for v in SPLITS) + f" {'loop':>7}")
    for bsz in (1, 8):
        w_pages = ring // ps
        wpool = _fp8_pool(bsz * w_pages + 1, ps, dev, g)
        wtab = torch.randperm(bsz * w_pages, device=dev, generator=g).view(bsz, w_pages)
        q = torch.randn(bsz, 64, 512, device=dev, generator=g).to(torch.bfloat16)
        pos = torch.full((bsz,), ctx - 1, device=dev)
        sink = torch.randn(64, device=dev, generator=g)
        for kind, ratio in (("sliding", 0), ("CSA", 4), ("HCA", 128)):
            comp = table = idx = count = None
            if ratio:
                n = ctx // ratio
                c_pages = -(-n // ps)
                comp = _fp8_pool(bsz * c_pages + 1, ps, dev, g)
                table = torch.randperm(bsz * c_pages, device=dev, generator=g).view(bsz, c_pages)
                if ratio == 4:
                    idx = torch.stack([torch.randperm(n, device=dev, generator=g)[:512].sort().values
                                       for _ in range(bsz)])
                else:
                    count = torch.full((bsz,), n, device=dev)
            args = (q, pos, None, None, wpool, wtab, ring, 128, comp, table, idx, count, sink, 512 ** -0.5)
            want = decode_attention(*args, splits=1)
            row = []
            for sp in SPLITS:
                got = decode_attention(*args, splits=sp, combine="wide")
                err = (got.float() - want.float()).abs().max().item()
                assert err <= 2 ** -6 * want.float().abs().max().item(), (kind, bsz, sp, err)
                row.append(graph_us(lambda: decode_attention(*args, splits=sp, combine="wide")))
            loop = decode_attention(*args, combine="loop")
            err = (loop.float() - want.float()).abs().max().item()
            assert err <= 2 ** -6 * want.float().abs().max().item(), (kind, bsz, "loop", err)
            row.append(graph_us(lambda: decode_attention(*args, combine="loop")))
            print(f"{kind:8s} {bsz:3d} " + " ".join(f"{v:7.1f}" for v in row))


def greedy_pick() -> None:
    """µs per greedy pick over [B, 129280] fp32 logits (the Flash vocabulary): torch's argmax and the two-pass
    `dsv4.engine.sampler.first_argmax`, which must give the same ids (ties made likely: logits rounded)."""
    from dsv4.engine.sampler import first_argmax
    dev, g = torch.device("cuda"), torch.Generator(device="cuda").manual_seed(3)
    print("greedy pick over 129280 logits: µs per call in a CUDA graph, torch argmax / first_argmax")
    for bsz in (1, 8, 64):
        logits = (torch.randn(bsz, 129280, device=dev, generator=g) * 4).round()
        assert torch.equal(first_argmax(logits), logits.argmax(-1)), "first_argmax differs from argmax"
        print(f"B={bsz:2d} {graph_us(lambda: logits.argmax(-1)):8.2f} {graph_us(lambda: first_argmax(logits)):8.2f}")


SPLITS = (None, 4, 8, 16, 20, 32, 40, 64)


if __name__ == "__main__":
    main()
