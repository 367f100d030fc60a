"""The routed MoE call (`fused_moe`, default config for each M) under module-flag variants, side by side in
one run, Flash experts, L2 flushed, with the share of outputs bit-identical to the first variant's and the
relative RMS difference to it:

    python bench/bench_moe_flags.py --ms 2048,4096,8192 "default:" \
        "one warpgroup:dsv4.kernels.moe_wide.DOWN_ONE_WARPGROUP=True"

A variant is `name:` followed by comma-separated `module.NAME=value` settings (bench/flags.py), applied for
that variant only. Times: triton's do_bench (median) minus the flush's own time; with `--graphs N` (decode sizes,
where a flushed call is mostly launch noise) instead µs per call of N calls with different routings replayed
from one CUDA graph (`sweep_linear.graph_us`; the weights of N calls exceed L2), with the expert bytes those calls
touch (codes and scales of the distinct experts each routing picks, averaged over the N calls) and each variant's
share of the copy bandwidth measured in the same run at them -- issue #5's MoE decode measure. A development aid;
docs/benchmarks.md cites the calls.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def routed_inputs(m: int, d: int, e: int, k: int, seed: int | None = None):
    """x [m, d] bf16, top-k ids [m, k] over e experts and routing weights, fresh for each m (or seed)."""
    gen = torch.Generator("cuda").manual_seed(m if seed is None else seed)
    x = torch.randn(m, d, device="cuda", generator=gen).to(torch.bfloat16)
    ids = torch.rand(m, e, device="cuda", generator=gen).topk(k, dim=1).indices
    return x, ids, torch.rand(m, k, device="cuda", generator=gen) + 0.1


def flushed_cell(run, first, flush, t_flush: float):
    """'ms (share of outputs equal to first's, relative RMS difference)' of run() with L2 flushed; run() gives
    the output (first None: this is the first)."""
    import triton
    y = run()
    first = y if first is None else first

    def call():
        flush.zero_()
        run()

    t = triton.testing.do_bench(call, warmup=3, rep=30) - t_flush
    rel = float((y.float() - first.float()).norm() / first.float().norm())
    return f"{t:.3f} ({float((y == first).double().mean()):.4f}, {rel:.1e})", first


def touched_bytes(m: int, d: int, e: int, k: int, calls: int, expert_bytes: int) -> float:
    """Expert bytes one of `graph_cell`'s `calls` routings of m tokens touches, on average (distinct experts x
    expert_bytes)."""
    ids = [routed_inputs(m, d, e, k, seed=m + 1000 * c)[1] for c in range(calls)]
    return sum(int(torch.unique(i).numel()) for i in ids) / calls * expert_bytes


def graph_cell(m: int, d: int, e: int, k: int, run, first, calls: int, nbytes: float = 0.0, copy_tbs: float = 0.0):
    """'µs (share of outputs equal to first's, relative RMS difference)' of `calls` routings of m tokens in one
    CUDA graph (with nbytes and copy_tbs: then the share of the copy bandwidth those bytes take);
    run(x, ids, w) gives the output of one call (first None: this is the first)."""
    from bench.sweep_linear import graph_us

    inputs = [routed_inputs(m, d, e, k, seed=m + 1000 * c) for c in range(calls)]  # (call 0: the flushed inputs)
    y = run(*inputs[0])
    first = y if first is None else first
    t = graph_us([lambda a=a: run(*a) for a in inputs])
    rel = float((y.float() - first.float()).norm() / first.float().norm())
    share = f", {nbytes / (t * 1e-6) / (copy_tbs * 1e12):.1%} of copy" if nbytes and copy_tbs else ""
    return f"{t:.1f} ({float((y == first).double().mean()):.4f}, {rel:.1e}{share})", first


def main() -> None:
    import triton

    from bench.bench_gemm_moe import MOE, random_experts
    from bench.flags import apply, restore
    from dsv4.kernels.moe import fused_moe

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ms", default="2048,4096,8192")
    p.add_argument("--experts", default="flash", choices=sorted(MOE))
    p.add_argument("--graphs", type=int, default=0, help="time N calls in one CUDA graph (µs per call)")
    p.add_argument("variants", nargs="+")
    a = p.parse_args()
    # (the flags split at commas outside parentheses: a tuple value such as `moe_glu_decode.DOWN_BOUND=(160,200)`)
    variants = [(v.partition(":")[0], [s for s in re.split(r",(?![^()]*\))", v.partition(":")[2]) if s])
                for v in a.variants]
    e, d, i, k = MOE[a.experts]
    ex = random_experts(e, d, i, "mxfp4")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    t_flush = triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
    unit = "µs" if a.graphs else "ms"
    copy_tbs, expert_bytes = 0.0, 0
    if a.graphs:
        from bench.sweep_linear import copy_bandwidth
        copy_tbs = copy_bandwidth()
        expert_bytes = sum(t[0].numel() * t.element_size() for t in (ex.w13, ex.w13_scale, ex.w2, ex.w2_scale))
        print(f"copy bandwidth {copy_tbs:.2f} TB/s ({torch.cuda.get_device_name()}); {expert_bytes / 1e6:.2f} MB per "
              "expert (codes and scales)")
    cols = [f"{name} {unit} (same, rel)" for name, _ in variants]
    print("M | " + ("MB touched | " if a.graphs else "") + " | ".join(cols))
    for m in (int(x) for x in a.ms.split(",")):
        x, ids, w = routed_inputs(m, d, e, k)
        row, first = [], None
        nbytes = touched_bytes(m, d, e, k, a.graphs, expert_bytes) if a.graphs else 0.0
        if a.graphs:
            row.append(f"{nbytes / 1e6:.1f}")
        for name, settings in variants:
            old = apply(settings)
            try:
                if a.graphs:
                    cell, first = graph_cell(m, d, e, k, lambda *xs: fused_moe(*xs, ex), first, a.graphs, nbytes,
                                             copy_tbs)
                else:
                    cell, first = flushed_cell(lambda: fused_moe(x, ids, w, ex), first, flush, t_flush)
                row.append(cell)
            except Exception as err:  # a variant that fails: say so, go on
                row.append(f"ERR {str(err)[:120]}")
            finally:
                restore(old)
        print(f"{m} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
