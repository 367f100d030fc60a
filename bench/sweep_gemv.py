"""One-token FP8 linears (issue #6, decode at batch 1): the CUDA-core GEMV (`dsv4.kernels.fp8_gemv`) against
the tensor-core GEMM the model runs now (`fp8_linear`, `grouped_linear_w8a16`) and against a plain read of
the same weight bytes (the floor any kernel of that size meets: launch, ramp-up, tail, bandwidth).

Timing as `sweep_linear.py`: `copies` launches on distinct weight copies (together larger than L2) in one
CUDA graph, µs per launch.

    python bench/sweep_gemv.py [--models flash] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gemm_moe import GROUPED, LINEARS  # noqa: E402
from bench.sweep_linear import copies_for, copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels import linear_config  # noqa: E402
from dsv4.kernels.fp8_gemv import GemvConfig, fp8_gemv  # noqa: E402
from dsv4.kernels.fp8_linear import fp8_linear, pick_gemv_config, pick_linear_config  # noqa: E402
from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16, pick_grouped_config  # noqa: E402

DEV = "cuda"


@triton.jit
def _read_kernel(W, OUT, stride_wn, KB_PER_SPLIT, BN: tl.constexpr, KU: tl.constexpr):
    """Sum a [BN, KB_PER_SPLIT*128] byte tile as int32 (the bytes must be read; one word stored)."""
    BKU: tl.constexpr = KU * 128
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rows = pid_n * BN + tl.arange(0, BN)
    cols = tl.arange(0, BKU)
    ptrs = W + rows[:, None].to(tl.int64) * stride_wn + pid_k * KB_PER_SPLIT * 128 + cols[None, :]
    acc = tl.zeros((BN,), dtype=tl.int32)
    for kb in range(0, KB_PER_SPLIT, KU):
        acc += tl.sum(tl.load(ptrs + kb * 128).to(tl.int32), axis=1)
    tl.store(OUT + pid_n * tl.num_programs(1) + pid_k, tl.sum(acc))


def read_floor(ws) -> tuple[float, str]:
    """Fastest plain read of each weight (µs per launch) over a few grid shapes."""
    n, k = ws[0].shape
    best = (float("inf"), "")
    out = torch.empty(1 << 16, dtype=torch.int32, device=DEV)
    for bn, ku, split, warps in itertools.product((16, 32, 64), (4, 8), (1, 2, 4, 8), (4, 8)):
        kb = k // 128
        if n % bn or kb % (split * ku) or (n // bn) * split > out.numel():
            continue
        t = graph_us([lambda w=w: _read_kernel[(n // bn, split)](w.view(torch.uint8), out, w.stride(0), kb // split, BN=bn, KU=ku,
                                                                  num_warps=warps) for w in ws])
        best = min(best, (t, f"bn={bn} ku={ku} split={split} warps={warps}"))
    return best


def gemv_grid() -> list[GemvConfig]:
    grid = [GemvConfig(bn, ku, 0, w) for bn, ku, w in itertools.product((16, 32, 64), (2, 4, 8), (4, 8))
            if bn * ku * 128 <= 256 * 32 * w]  # at most 256 weight bytes per thread and step
    grid += [GemvConfig(32, 4, s, 4) for s in (1, 2, 4, 8, 16)]
    return grid


def with_picked(n: int, k: int, groups: int) -> list[GemvConfig]:
    picked = pick_gemv_config(1, n, k, groups=groups, quant_x=groups == 1)
    return gemv_grid() + ([picked] if picked is not None else [])


def sweep(model: str, bw: float, cap: int) -> list[dict]:
    rows = []
    shapes = [(name, n, k, 1) for name, n, k in LINEARS[model]] + [("wq_a+wkv", 2048 if model == "pro" else 1536,
                                                                     LINEARS[model][0][2], 1)]
    g, ro, kg = GROUPED[model]
    shapes.append(("wo_a w8a16", g * ro, kg, g))
    for name, n, k, groups in shapes:
        c = copies_for(n * k, cap)
        ws = [(torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn) for _ in range(c)]
        ss = [torch.randint(118, 125, (n // 128, k // 128), device=DEV, dtype=torch.uint8).view(
            torch.float8_e8m0fnu) for _ in range(c)]
        x = torch.randn(1, groups, k, device=DEV).to(torch.bfloat16) if groups > 1 else \
            torch.randn(1, k, device=DEV).to(torch.bfloat16)
        # "gemm": the tensor-core kernels (the model's one-row path before the GEMV)
        if groups > 1:
            mma = pick_grouped_config(1)
            ref = grouped_linear_w8a16(x, ws[0], ss[0], config=mma)
            t_now = graph_us([lambda w=w, s=s: grouped_linear_w8a16(x, w, s, config=mma) for w, s in zip(ws, ss)])
        else:
            mma = pick_linear_config(1, n, k)
            ref = fp8_linear(x, ws[0], ss[0], config=mma)
            t_now = graph_us([lambda w=w, s=s: fp8_linear(x, w, s, config=mma) for w, s in zip(ws, ss)])
        picked = pick_gemv_config(1, n, k, groups=groups, quant_x=groups == 1)
        results = []
        for cfg in with_picked(n, k, groups):
            try:
                y = fp8_gemv(x, ws[0], ss[0], groups=groups, quant_x=groups == 1, config=cfg)
            except ValueError:
                continue
            err = (y.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
            t = graph_us([lambda w=w, s=s: fp8_gemv(x, w, s, groups=groups, quant_x=groups == 1, config=cfg)
                          for w, s in zip(ws, ss)])
            results.append((t, cfg, err))
        t_best, best, err = min((r for r in results if r[0] == r[0]), key=lambda r: r[0])
        t_read, read_cfg = read_floor(ws)
        floor = n * k / (bw * 1e6)
        t_pick = next((t for t, cf, _ in results if picked is not None and cf == picked), float("nan"))
        rows.append(dict(model=model, name=name, n=n, k=k, gemm_us=t_now, gemv_us=t_best, gemv=str(best),
                         picked=str(picked), picked_us=t_pick, rel_err=err, read_us=t_read, read=read_cfg,
                         bw_floor_us=floor, all=[(round(t, 2), str(cf)) for t, cf, _ in sorted(results, key=lambda r: r[0])]))
        print(f"{model} {name:12s} {n * k / 1e6:5.1f} MB  gemm {t_now:6.2f}  gemv best {t_best:6.2f} ({best.bn},"
              f"{best.ku},{best.split_k},{best.num_warps}) picked {t_pick:6.2f} rel.err {err:.1e}  read {t_read:6.2f} "
              f"({read_cfg})  bytes@copy {floor:5.2f} µs", flush=True)
        del ws, ss
        torch.cuda.empty_cache()
    return rows


def sweep_rows(model: str, ms: list[int], cap: int) -> list[dict]:
    """A few rows: the GEMV at its pick for M rows against the tensor-core kernels at the same M."""
    rows = []
    g, ro, kg = GROUPED[model]
    linear_config.GEMV_MAX_M = max(ms)  # the picks for more rows, whatever the default
    for name, n, k, groups in [(name, n, k, 1) for name, n, k in LINEARS[model]] + [("wo_a w8a16", g * ro, kg, g)]:
        if pick_gemv_config(1, n, k, groups=groups, quant_x=groups == 1) is None:
            continue
        c = copies_for(n * k, cap)
        ws = [(torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn) for _ in range(c)]
        ss = [torch.randint(118, 125, (n // 128, k // 128), device=DEV, dtype=torch.uint8).view(
            torch.float8_e8m0fnu) for _ in range(c)]
        for m in ms:
            picked = pick_gemv_config(m, n, k, groups=groups, quant_x=groups == 1)
            x = torch.randn(m, groups, k, device=DEV).to(torch.bfloat16) if groups > 1 else \
                torch.randn(m, k, device=DEV).to(torch.bfloat16)
            if groups > 1:
                mma = pick_grouped_config(m)
                t_mma = graph_us([lambda w=w, s=s: grouped_linear_w8a16(x, w, s, config=mma) for w, s in zip(ws, ss)])
            else:
                mma = pick_linear_config(m, n, k)
                t_mma = graph_us([lambda w=w, s=s: fp8_linear(x, w, s, config=mma) for w, s in zip(ws, ss)])
            t_gemv = graph_us([lambda w=w, s=s: fp8_gemv(x, w, s, groups=groups, quant_x=groups == 1, config=picked)
                               for w, s in zip(ws, ss)])
            rows.append(dict(model=model, name=name, m=m, gemm_us=t_mma, gemv_us=t_gemv, gemv=str(picked)))
            print(f"{model} {name:12s} M={m}  gemm {t_mma:6.2f}  gemv {t_gemv:6.2f} µs ({picked.bn} x {picked.ku})", flush=True)
        del ws, ss
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="flash")
    ap.add_argument("--copies", type=int, default=24)
    ap.add_argument("--rows", default="", help="also time these row counts (e.g. 1,2,3,4) at the one-row picks")
    ap.add_argument("--skip-grid", action="store_true", help="only the --rows table")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    rows = []
    for model in args.models.split(","):
        if not args.skip_grid:
            rows += sweep(model, bw, args.copies)
        if args.rows:
            rows += sweep_rows(model, [int(v) for v in args.rows.split(",")], args.copies)
    with open(os.path.join(args.out, "sweep_gemv.json"), "w") as f:
        json.dump(dict(copy_TBps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
