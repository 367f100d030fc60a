"""The CSA indexer's prefill scores (`prefill_index_scores`) over launch shapes, for a prompt chunk after a long
prefix: T queries of Flash's indexer (64 heads x 128) against every compressed key of the prefix and the chunk
(N = (prefix + T) / 4). At a 56K prefix this launch took 4.6 ms of an 18.7 ms CSA layer (H100, session 67), and it
grows with the prefix. Per shape: µs (triton do_bench, median), TFLOP/s over the visible keys, and the share of
scores equal to the default shape's (the per-head dots and bf16 roundings are the same math; tile shapes may
change the fp32 sum order of the dot). `default`: the Triton kernel at PREFILL_SHAPE; `default unpacked`: with
`indexer_scores.PACKED_RELU` off; `gluon`: the Gluon kernel (`indexer_scores.PREFILL_GLUON_MIN_KEYS`); `fp8` / `gluon
fp8`: those kernels on the operands folded to e4m3 (`prefill_index_scores(fp4=True)`, the fold included; with
`--fp4` the operands are FP4-simulated, as the model's, and the scores must equal the default's). Then the
radix top-k of the same scores (`--topk`: over its chunk length and warps too; `--sampled`: `topk.SAMPLED` against
the default; its picks must not change).

    python bench/sweep_index_scores.py [--tokens 8192] [--prefix 57344] [--shapes 64,128,4,3 128,128,8,3 ...] [--topk]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

HEADS, DIM, TOPK, RATIO = 64, 128, 512, 4  # Flash's indexer
TOPK_SETTINGS = [(1024, 4), (2048, 4), (4096, 4), (2048, 8), (4096, 16), (8192, 8), (8192, 16), (16384, 16)]
SHAPES = [f"{bt},{bn},{w},{st}" for bt in (64, 128) for bn in (64, 128, 256) for w in (4, 8) for st in (2, 3, 4)]


def main() -> None:
    import triton

    from dsv4.kernels import indexer_scores
    from dsv4.kernels.indexer_scores import prefill_index_scores
    from dsv4.kernels.topk import topk_lowest_index

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--prefix", type=int, default=57344)
    p.add_argument("--shapes", nargs="*", default=SHAPES, help="block_t,block_n,warps,stages")
    p.add_argument("--topk", action="store_true", help="also the top-k's chunk and warps (topk.BLOCK_MAX, WARPS_LARGE)")
    p.add_argument("--sampled", action="store_true", help="also the sampled top-k (topk.SAMPLED), default, sampled, "
                   "default, sampled")
    p.add_argument("--fp4", action="store_true", help="FP4-simulated q and keys (the model's reference numerics)")
    p.add_argument("--ref-fold", action="store_true", help="with --fp4: `fp8` / `gluon fp8` time the FP8 launch alone "
                   "on operands folded once by `fold_rows_ref` (flag set), and `fold` the Triton fold of q and keys")
    args = p.parse_args()
    t, n = args.tokens, (args.prefix + args.tokens) // RATIO
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(t, HEADS, DIM, device="cuda", generator=gen).to(torch.bfloat16)
    w = (torch.randn(t, HEADS, device="cuda", generator=gen) * (DIM * HEADS) ** -0.5).to(torch.bfloat16)
    keys = torch.randn(n, DIM, device="cuda", generator=gen).to(torch.bfloat16)
    if args.fp4:
        from dsv4.model.numerics import simulate_indexer_fp4

        q, keys = simulate_indexer_fp4(q), simulate_indexer_fp4(keys)
    vis = ((args.prefix + torch.arange(t, device="cuda") + 1) // RATIO).to(torch.int32)
    flop = 2 * HEADS * DIM * vis.sum().item()
    print(f"{torch.cuda.get_device_name()}: T = {t} queries after {args.prefix} tokens, N = {n} keys, "
          f"{flop / 1e12:.2f} TFLOP over the visible keys")
    gluon_min = indexer_scores.PREFILL_GLUON_MIN_KEYS
    indexer_scores.PREFILL_GLUON_MIN_KEYS = 1 << 62  # `default`: the Triton kernel (`gluon`: the Gluon one)
    base = prefill_index_scores(q, w, keys, vis)
    print("block_t,block_n,warps,stages | µs | TFLOP/s | same as default")
    named = ("default", "default unpacked", "gluon", "fp8", "gluon fp8")
    indexer_scores.PREFILL_FP8, indexer_scores.PREFILL_FP8_MIN_KEYS = True, 0  # (only the fp4=True calls fold)
    folded = None
    if args.ref_fold:
        from dsv4.kernels.indexer_fp8 import fold_rows, fold_rows_ref

        q8, w8, _ = fold_rows_ref(q.reshape(-1, DIM), w.reshape(-1))
        k8, sk, _ = fold_rows_ref(keys)
        ones = torch.ones(1, dtype=torch.int32, device="cuda")
        folded = (q8.view(t, HEADS, DIM), w8.view(t, HEADS), k8, sk, ones)
        flag = torch.ones(1, dtype=torch.int32, device="cuda")  # (not `ones`: a row that does not fold clears it)
        ms = triton.testing.do_bench(lambda: (fold_rows(q, w, flag), fold_rows(keys, None, flag)), warmup=3, rep=30)
        print(f"fold (Triton, q and keys) | {ms * 1e3:.0f} | flag {flag.item()}")
    for shape in [*named, *args.shapes]:
        kw = {"fp4": True} if "fp8" in shape else {} if shape in named else dict(
            zip(("block_t", "block_n", "warps", "stages"), map(int, shape.split(","))))
        indexer_scores.PACKED_RELU = shape != "default unpacked"  # (the per-element bf16 rounding before session 68)
        indexer_scores.PREFILL_GLUON_MIN_KEYS = 0 if shape.startswith("gluon") else 1 << 62
        indexer_scores.PREFILL_FP8_GLUON = shape.startswith("gluon")
        try:
            if folded is not None and "fp8" in shape:  # the FP8 launch alone, on the reference's folded operands
                q8, w8, k8, sk, ones = folded
                out = torch.empty_like(base)

                def call():
                    indexer_scores._prefill_launch(q8, w8, k8, vis, out, (None,) * 4, sk, ones, 1)
                call()
            else:
                def call():
                    return prefill_index_scores(q, w, keys, vis, **kw)
                out = call()
            ms = triton.testing.do_bench(call, warmup=3, rep=30)
        except Exception as e:  # noqa: BLE001 (a shape past shared memory or registers: say so, go on)
            print(f"{shape} | ERR {str(e).splitlines()[0][:80]}")
            continue
        finally:
            indexer_scores.PACKED_RELU, indexer_scores.PREFILL_GLUON_MIN_KEYS = True, gluon_min
        same = (out == base).float().mean().item()
        print(f"{shape} | {ms * 1e3:.0f} | {flop / ms / 1e9:.0f} | {same:.5f}")
    from dsv4.kernels import topk

    def pick():
        return topk_lowest_index(base, TOPK, mark_absent=True, visible=vis, index_dtype=torch.int32)[0]

    want = pick()
    print(f"top-{TOPK} of the [{t}, {n}] scores: topk settings (SAMPLED off unless named) | µs | picks equal to the "
          "default's")
    base_knobs = dict(BLOCK_MAX=topk.BLOCK_MAX, WARPS_LARGE=topk.WARPS_LARGE, SAMPLED=False,
                      SAMPLED_GROUP=topk.SAMPLED_GROUP, SAMPLED_FIT=topk.SAMPLED_FIT)
    settings = [{}] + [dict(BLOCK_MAX=b, WARPS_LARGE=w) for b, w in TOPK_SETTINGS if args.topk]
    if args.sampled:  # the sampled kernel as session 71 measured it, then with the grouped scan, then fitted chunks
        settings += [dict(SAMPLED=True, SAMPLED_GROUP=1, SAMPLED_FIT=False), dict(SAMPLED=True, SAMPLED_GROUP=8),
                     dict(SAMPLED=True, SAMPLED_GROUP=8, SAMPLED_FIT=True), {},
                     dict(SAMPLED=True, SAMPLED_GROUP=8, SAMPLED_FIT=True)]
    for knobs in settings:
        knobs = {**base_knobs, **knobs}
        old = {name: getattr(topk, name) for name in knobs}
        for name, value in knobs.items():
            setattr(topk, name, value)
        label = ", ".join(f"{name}={value}" for name, value in knobs.items() if value != base_knobs[name])
        try:
            same = bool((pick() == want).all())
            ms = triton.testing.do_bench(pick, warmup=3, rep=30)
            print(f"{label or 'default'} | {ms * 1e3:.0f} | {same}")
        except Exception as e:  # noqa: BLE001 (past registers or shared memory: say so, go on)
            print(f"{label} | ERR {str(e).splitlines()[0][:80]}")
        finally:
            for name, value in old.items():
                setattr(topk, name, value)


if __name__ == "__main__":
    main()
