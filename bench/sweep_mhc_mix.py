"""Sweep the prefill launch shape of the mHC mix kernel (`dsv4.kernels.mhc`: MIX_BT / FUSED_BT rows, MIX_BK
columns per step, MIX_WARPS, MIX_STAGES, MIX_TRANS) for hc_pre and the fused hc_post_pre at Flash width.

Each case: µs per call from a CUDA graph of `--calls` calls, and the largest difference of its post / comb /
u from the module's default shape (another K order in the mix's dots moves the last bits).

    python bench/sweep_mhc_mix.py [--tokens 8192] [--hidden 4096] [--ops hc_pre,hc_post_pre] [--rows 16,32,64]
        [--cols 32,64,128] [--warps 4,8]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from triton.testing import do_bench  # noqa: E402

from dsv4.kernels import mhc  # noqa: E402


def graph_us(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return do_bench(g.replay, warmup=2, rep=20, return_mode="median") * 1e3 / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="8192")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--ops", default="hc_pre,hc_post_pre")
    ap.add_argument("--rows", default="16,32,64", help="tile rows (MIX_BT / FUSED_BT) to sweep")
    ap.add_argument("--cols", default="32,64,128", help="columns per step (MIX_BK) to sweep")
    ap.add_argument("--warps", default="4,8")
    args = ap.parse_args()
    d, dev = args.hidden, torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    fn = mhc.prepare_mix(torch.randn(24, 4 * d, device=dev, generator=g) * 0.02)
    base, scale = torch.randn(24, device=dev, generator=g) * 0.1, torch.rand(3, device=dev, generator=g) + 0.5
    norm_w = (torch.rand(d, device=dev, generator=g) + 0.5).to(torch.bfloat16)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6, norm_weight=norm_w)
    default = dict(MIX_BT=mhc.MIX_BT, FUSED_BT=mhc.FUSED_BT, MIX_BK=mhc.MIX_BK, MIX_WARPS=mhc.MIX_WARPS,
                   MIX_STAGES=mhc.MIX_STAGES, MIX_TRANS=mhc.MIX_TRANS)
    gbytes = {}
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, 4, d, device=dev, generator=g).to(torch.bfloat16)
        f = torch.randn(t, d, device=dev, generator=g).to(torch.bfloat16)
        post = torch.rand(t, 4, device=dev, generator=g) * 2
        comb = torch.rand(t, 4, 4, device=dev, generator=g) / 4
        ops = {"hc_pre": (lambda: mhc.hc_pre(x, fn, base, scale, **kw), "MIX_BT", 4 * t * d * 2),
               "hc_post_pre": (lambda: mhc.hc_post_pre(f, x, post, comb, fn, base, scale, **kw), "FUSED_BT",
                               (8 * t * d + t * d) * 2)}
        for op, (call, bt_knob, nbytes) in ops.items():
            if op not in args.ops.split(","):
                continue
            for k, v in default.items():
                setattr(mhc, k, v)
            want = [o.clone() for o in _flat(call())]
            rows = []
            for bt, bk, warps, stages, trans in itertools.product(_ints(args.rows), _ints(args.cols), _ints(args.warps), (2, 3),
                                                                  (False, True)):
                if trans and (bt < 32 or warps != 4):  # the transposed mix: one 64-row wgmma per warpgroup
                    continue
                for k, v in dict(default, **{bt_knob: bt, "MIX_BK": bk, "MIX_WARPS": warps,
                                             "MIX_STAGES": stages, "MIX_TRANS": trans}).items():
                    setattr(mhc, k, v)
                try:
                    got = _flat(call())
                    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, want))
                    us = graph_us(call, args.calls)
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: report, go on
                    print(f"  {op} T={t} bt={bt} bk={bk} w={warps} s={stages} trans={trans}: {type(e).__name__}")
                    continue
                rows.append((us, bt, bk, warps, stages, trans, diff))
            rows.sort()
            gbytes[op] = nbytes
            for k, v in default.items():
                setattr(mhc, k, v)
            us_def = graph_us(call, args.calls)
            print(f"{op} T={t}: default {us_def:.1f} µs ({nbytes / us_def / 1e3:.0f} GB/s); fastest:")
            for us, bt, bk, warps, stages, trans, diff in rows[:6]:
                print(f"   {us:8.1f} µs {nbytes / us / 1e3:6.0f} GB/s  bt={bt:3d} bk={bk:3d} warps={warps} "
                      f"stages={stages} trans={trans}  max diff {diff:.2e}", flush=True)


def _ints(csv: str) -> list[int]:
    return [int(v) for v in csv.split(",")]


def _flat(out):
    return [o for o in out if isinstance(o, torch.Tensor)]


if __name__ == "__main__":
    main()
