"""Decode-step glue kernels timed inside CUDA graphs (20 calls per graph, so launch gaps count as they
do in a captured step): mHC pre / post+pre at decode sizes, for this tree's `dsv4.kernels.mhc` and,
side by side, a baseline copy of that module (`--baseline path/to/mhc.py`, e.g. the last commit's).
Checks that both give the same post/comb and nearly the same u. A development aid for issue #6.

    python bench/bench_glue.py [--baseline /tmp/mhc_base.py] [--tokens 1,8,64]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

CALLS = 20


def graph_us(fn, reps: int = 20) -> float:
    """Microseconds per call of `fn`, captured CALLS times in one graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * CALLS)


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
    args = p.parse_args()
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
    print(f"{'op':14s} {'T':>5} " + " ".join(f"{n:>12s}" for n in mods))
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, 4, d, device=dev, generator=g).to(torch.bfloat16)
        f = torch.randn(t, d, device=dev, generator=g).to(torch.bfloat16)
        post = torch.rand(t, 4, device=dev, generator=g) * 2
        comb = torch.rand(t, 4, 4, device=dev, generator=g) / 4
        outs, row_pre, row_pp = [], [], []
        for name, m in mods.items():
            w = m.prepare_mix(fn)
            outs.append(m.hc_pre(x, w, base[:24], scale, **kw))
            row_pre.append(graph_us(lambda: m.hc_pre(x, w, base, scale, **kw)))
            row_pp.append(graph_us(lambda: m.hc_post_pre(f, x, post, comb, w, base, scale, **kw)))
        if len(outs) == 2:
            (u0, p0, c0), (u1, p1, c1) = outs
            assert torch.equal(p0, p1) and torch.allclose(c0, c1, rtol=1e-6, atol=0), "post/comb differ"
            du = (u0.float() - u1.float()).abs().max().item()
            assert du <= 2 ** -6 * u0.float().abs().max().item(), f"u differs by {du}"
        print(f"{'hc_pre':14s} {t:5d} " + " ".join(f"{v:12.2f}" for v in row_pre))
        print(f"{'hc_post_pre':14s} {t:5d} " + " ".join(f"{v:12.2f}" for v in row_pp))


if __name__ == "__main__":
    main()
