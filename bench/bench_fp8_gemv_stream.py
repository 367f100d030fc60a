"""The persistent FP8 GEMV (dsv4.kernels.fp8_gemv_stream, prepared) against the model's FP8 linear
(`fp8_linear`: the CUDA-core GEMV or the swap-AB GEMM, as `linear_config` picks) at Flash's or Pro's decode linears.

µs per call of `--calls` calls on as many different weights (more bytes than L2 holds) replayed from one CUDA graph
(`sweep_linear.graph_us`); GB/s of the weight bytes (codes + scales) and their share of the copy bandwidth measured
first in the same run; in brackets the relative RMS difference of the outputs.

    python bench/bench_fp8_gemv_stream.py [--model flash] [--ms 1,2,8] [--calls 16]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gemm_moe import LINEARS  # noqa: E402
from bench.sweep_linear import copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels.fp8_gemv_stream import fp8_gemv_stream  # noqa: E402
from dsv4.kernels.fp8_linear import fp8_linear  # noqa: E402
from dsv4.quant.fp8 import quantize_fp8_block  # noqa: E402

DEV = "cuda"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="flash", choices=sorted(LINEARS))
    ap.add_argument("--ms", default="1,2,8")
    ap.add_argument("--calls", type=int, default=16)
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    gen = torch.Generator(DEV).manual_seed(0)
    print("linear | M | MB | fp8_linear µs (% of copy) | stream µs (% of copy) [rel RMS] | ratio")
    for name, n, k in LINEARS[args.model]:
        weights = [quantize_fp8_block(torch.randn(n, k, device=DEV, generator=gen) * 0.02, "e8m0")
                   for _ in range(args.calls)]
        nbytes = n * k * (1 + 1 / 128 / 128)
        for m in (int(t) for t in args.ms.split(",")):
            x = (torch.randn(m, k, device=DEV, generator=gen)).to(torch.bfloat16)
            t_ref = graph_us([lambda w=w, s=s: fp8_linear(x, w, s) for w, s in weights])
            t_new = graph_us([lambda w=w, s=s: fp8_gemv_stream(x, w, s) for w, s in weights])
            a, b = fp8_linear(x, *weights[0]).double(), fp8_gemv_stream(x, *weights[0]).double()
            rel = float((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt().clamp_min(1e-30))
            share = [nbytes / t / 1e6 / bw * 100 for t in (t_ref, t_new)]
            print(f"{name} | {m} | {nbytes / 1e6:.1f} | {t_ref:.1f} ({share[0]:.0f} %) | {t_new:.1f} "
                  f"({share[1]:.0f} %) [{rel:.1e}] | {t_ref / t_new:.2f}x", flush=True)
        del weights


if __name__ == "__main__":
    main()
