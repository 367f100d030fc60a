"""Does pulling a decode GEMM's weight into L2 beforehand (`dsv4.kernels.l2_prefetch`) pay? One device call.

Per Flash weight at batch 1, µs per call from CUDA graphs over `--copies` distinct weights (cold HBM):
  cold      the linear alone
  warm      the same weight every call (what an L2 hit would give, as far as it fits)
  prefetch  `prefetch_l2` alone (its HBM rate)
  busy      a spin kernel of ~`--busy-us` µs (stands for attention / mHC: HBM idle), then the linear
  busy+pf   the same, with `prefetch_l2(W)` on a side stream beside the spin kernel
saving = busy - (busy+pf): what the prefetch takes off the linear when there is idle time before it.

    python bench/probe_l2_prefetch.py [--copies 8] [--busy-us 20]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from triton.testing import do_bench  # noqa: E402

from dsv4.kernels.fp8_linear import fp8_linear  # noqa: E402
from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16  # noqa: E402
from dsv4.kernels.l2_prefetch import prefetch_l2  # noqa: E402

DEV = "cuda"


def per_call_us(body, calls: int) -> float:
    side = torch.cuda.Stream()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body(side)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body(side)
    return do_bench(g.replay, warmup=3, rep=20, return_mode="median") * 1e3 / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--busy-us", type=float, default=20.0)
    args = ap.parse_args()
    c = args.copies
    # calibrate the spin kernel: cycles per µs
    probe = 200_000
    t = per_call_us(lambda side: torch.cuda._sleep(probe), 1)
    cycles = int(probe / t * args.busy_us)
    t_busy = per_call_us(lambda side: [torch.cuda._sleep(cycles) for _ in range(c)], c)
    print(f"spin kernel: {t_busy:.2f} µs per call ({cycles} cycles)")

    def fp8_weight(n, k):
        w = (torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn)
        s = torch.randint(118, 125, (n // 128, k // 128), device=DEV, dtype=torch.uint8).view(torch.float8_e8m0fnu)
        return w, s

    cases = []
    for name, n, k in (("wq_b", 32768, 1024), ("wo_b", 4096, 8192), ("sh_w13", 4096, 4096), ("wq_a|wkv", 1536, 4096)):
        x = torch.randn(1, k, device=DEV).to(torch.bfloat16)
        ws = [fp8_weight(n, k) for _ in range(c)]
        cases.append((name, ws, lambda w, x=x: fp8_linear(x, w[0], w[1])))
    xa = torch.randn(1, 8, 4096, device=DEV).to(torch.bfloat16)
    cases.append(("wo_a w8a16", [fp8_weight(8192, 4096) for _ in range(c)],
                  lambda w: grouped_linear_w8a16(xa, w[0], w[1])))

    print(f"{'weight':12s} {'MB':>6s} {'cold':>7s} {'warm':>7s} {'prefetch':>9s} {'busy':>7s} {'busy+pf':>8s} {'saving':>7s}")
    for name, ws, fn in cases:
        mb = ws[0][0].numel() / 1e6
        cold = per_call_us(lambda side: [fn(w) for w in ws], c)
        warm = per_call_us(lambda side: [fn(ws[0]) for _ in ws], c)
        pf = per_call_us(lambda side: [prefetch_l2(w[0]) for w in ws], c)

        def busy_then(side, with_pf):
            main = torch.cuda.current_stream()
            for w in ws:
                if with_pf:
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        prefetch_l2(w[0])
                torch.cuda._sleep(cycles)
                if with_pf:
                    main.wait_stream(side)
                fn(w)

        busy = per_call_us(lambda side: busy_then(side, False), c) - t_busy
        busy_pf = per_call_us(lambda side: busy_then(side, True), c) - t_busy
        print(f"{name:12s} {mb:6.1f} {cold:7.2f} {warm:7.2f} {pf:9.2f} {busy:7.2f} {busy_pf:8.2f} {busy - busy_pf:7.2f}",
              flush=True)


if __name__ == "__main__":
    main()
