"""Sweep the launch shapes of the decode-sized FP8 linears (issue #5): `fp8_linear`'s Triton GEMM and the
grouped W8A16 `wo_a`, at Flash (or Pro) shapes and M in {1, 8, 32, 64, 128} tokens.

Decode reads every weight once per step from HBM, back to back with other kernels. So each case is timed
as `--copies` launches on distinct weight copies (together larger than L2), captured in one CUDA graph,
replay time / copies: cold weights, no per-launch host cost, no L2 flush artefacts. Prints, per shape and
M, the default (`pick_linear_config` / `pick_grouped_config`), the best config and its GB/s, and the
copy bandwidth of the same run.

    python bench/sweep_linear.py [--models flash] [--ms 1,8,32,64,128] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from triton.testing import do_bench  # noqa: E402

from bench.bench_gemm_moe import GROUPED, LINEARS  # noqa: E402
from dsv4.kernels.fp8_linear import LinearConfig, fp8_linear, launch_split, pick_linear_config  # noqa: E402
from dsv4.kernels.grouped_w8a16 import GroupedConfig, grouped_linear_w8a16, pick_grouped_config  # noqa: E402

DEV = "cuda"
L2_BYTES = 50 << 20


def copy_bandwidth() -> float:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    b = torch.empty_like(a)
    ms = do_bench(lambda: b.copy_(a), warmup=5, rep=30, return_mode="median")
    return 2 * n / ms / 1e9  # TB/s


def graph_us(calls) -> float:
    """µs per call of `calls` (a list of closures) replayed from one CUDA graph; NaN if it fails."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in calls:
                c()
        ms = do_bench(g.replay, warmup=3, rep=15, return_mode="median")
        return ms * 1e3 / len(calls)
    except Exception as e:  # noqa: BLE001 - report, keep sweeping
        print(f"  failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
        torch.cuda.synchronize()
        return float("nan")


def linear_grid(m: int) -> list[LinearConfig]:
    grid = []
    if m <= 16:
        for bn, warps, stages, split in itertools.product((64, 128), (4, 8), (3, 4, 6), (0, 1, 2, 4, 8, 16)):
            if bn == 64 and warps == 8:
                continue
            grid.append(LinearConfig(bm=16, bn=bn, swap_ab=True, fuse_quant=True, split_k=split,
                                     num_warps=warps, num_stages=stages))
        return grid
    if m <= 64:
        for bn, fuse, stages, split in itertools.product((64, 128), (True, False), (3, 4), (0, 1, 2, 4, 8)):
            grid.append(LinearConfig(bm=max(16, m), bn=bn, swap_ab=True, fuse_quant=fuse, split_k=split,
                                     num_warps=4, num_stages=stages))
    for bm, stages, split in itertools.product((64, 128) if m > 64 else (64,), (3, 4), (0, 1, 2, 4, 8)):
        grid.append(LinearConfig(bm=bm, bn=128, swap_ab=False, fuse_quant=False, split_k=split,
                                 num_warps=8 if bm == 128 else 4, num_stages=stages))
    return grid


def copies_for(nbytes: int, cap: int) -> int:
    return max(2, min(cap, -(-4 * L2_BYTES // nbytes)))


def sweep_linears(model: str, ms: list[int], bw: float, cap: int) -> list[dict]:
    rows = []
    for name, n, k in LINEARS[model]:
        nbytes = n * k
        c = copies_for(nbytes, cap)
        ws = [(torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn) for _ in range(c)]
        ss = [torch.randint(118, 125, (n // 128, k // 128), device=DEV, dtype=torch.uint8).view(
            torch.float8_e8m0fnu) for _ in range(c)]
        for m in ms:
            x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
            seen, results = set(), []
            default = pick_linear_config(m, n, k)
            for cfg in [default] + linear_grid(m):
                split = launch_split(m, n, k, cfg)
                key = (cfg.bm, cfg.bn, cfg.swap_ab, cfg.fuse_quant, split, cfg.num_warps, cfg.num_stages)
                if key in seen:
                    continue
                seen.add(key)
                eff = LinearConfig(**{**cfg.__dict__, "split_k": split})
                t = graph_us([lambda w=w, s=s: fp8_linear(x, w, s, eff, backend="triton") for w, s in zip(ws, ss)])
                results.append((t, eff, cfg is default))
            done = [r for r in results if r[0] == r[0]]
            t_def = next(t for t, _, d in results if d)
            t_best, best, _ = min(done, key=lambda r: r[0])
            gbps = (nbytes + m * k * 2 + m * n * 2) / t_best / 1e3
            rows.append(dict(model=model, name=name, m=m, n=n, k=k, default_us=t_def, best_us=t_best,
                             best=str(best), gbps_best=gbps, pct_bw_best=100 * gbps / (bw * 1e3),
                             top=[(round(t, 2), str(cf)) for t, cf, _ in sorted(done, key=lambda r: r[0])[:4]]))
            print(f"{model} {name:14s} M={m:4d} default {t_def:7.2f} best {t_best:7.2f} µs "
                  f"({gbps:6.0f} GB/s, {rows[-1]['pct_bw_best']:4.0f}% copy) {best}", flush=True)
        del ws, ss
        torch.cuda.empty_cache()
    return rows


def sweep_grouped(model: str, ms: list[int], bw: float, cap: int) -> list[dict]:
    g, ro, k = GROUPED[model]
    nbytes = g * ro * k
    c = copies_for(nbytes, cap)
    ws = [(torch.randn(g * ro, k, device=DEV) * 0.5).to(torch.float8_e4m3fn) for _ in range(c)]
    ss = [torch.randint(118, 125, (g * ro // 128, k // 128), device=DEV, dtype=torch.uint8).view(
        torch.float8_e8m0fnu) for _ in range(c)]
    rows = []
    for m in [m for m in ms if m <= 64]:
        x = torch.randn(m, g, k, device=DEV).to(torch.bfloat16)
        default = pick_grouped_config(m)
        grid = [default] + [GroupedConfig(bn=bn, bm=default.bm, num_warps=w, num_stages=st, split_k=sp)
                            for bn, w, st, sp in itertools.product((64, 128), (4, 8), (3, 4, 6), (0, 1, 2, 4, 8))
                            if not (bn == 128 and w == 4)]
        results = []
        for cfg in grid:
            t = graph_us([lambda w=w, s=s: grouped_linear_w8a16(x, w, s, config=cfg) for w, s in zip(ws, ss)])
            results.append((t, cfg))
        done = [r for r in results if r[0] == r[0]]
        t_best, best = min(done, key=lambda r: r[0])
        gbps = (nbytes + 2 * m * g * (k + ro)) / t_best / 1e3
        rows.append(dict(model=model, name="wo_a w8a16", m=m, default_us=results[0][0], best_us=t_best,
                         best=str(best), gbps_best=gbps, pct_bw_best=100 * gbps / (bw * 1e3),
                         top=[(round(t, 2), str(cf)) for t, cf in sorted(done, key=lambda r: r[0])[:4]]))
        print(f"{model} wo_a w8a16     M={m:4d} default {results[0][0]:7.2f} best {t_best:7.2f} µs "
              f"({gbps:6.0f} GB/s, {rows[-1]['pct_bw_best']:4.0f}% copy) {best}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="flash")
    ap.add_argument("--ms", default="1,8,32,64,128")
    ap.add_argument("--copies", type=int, default=24, help="most weight copies per graph")
    ap.add_argument("--skip-grouped", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    rows = []
    for model in args.models.split(","):
        rows += sweep_linears(model, ms, bw, args.copies)
        if not args.skip_grouped:
            rows += sweep_grouped(model, ms, bw, args.copies)
    with open(os.path.join(args.out, "sweep_linear.json"), "w") as f:
        json.dump(dict(copy_TBps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
