"""What an L2 prefetch on a side stream buys a decode GEMV (session 20: nothing -- the model keeps none).

For each large Flash decode linear at M = 1 (the model's launcher and config), on `copies` distinct weight
copies (together > 4x L2, so each launch starts cold), µs per copy from one CUDA graph:

  cold        the linear alone
  hot         the linear again right after itself (its weight in L2 if it fits): t(pair) - cold
  chain       `--chain` small latency-bound launches (a 4 KB add each), standing in for the mHC / norm /
              attention kernels that precede a linear in a layer
  chain+lin   chain, then the linear
  +prefetch   the same with the weight's prefetch forked onto a side stream before the chain, joined after it

gain = chain+lin - (chain+lin +prefetch). The copy bandwidth of the same run is the ceiling.

    python bench/bench_l2_prefetch.py [--chain 4,8] [--chunks 4096,16384,65536]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gemm_moe import GROUPED, LINEARS  # noqa: E402
from bench.sweep_linear import copies_for, copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels._triton import prefetch_l2  # noqa: E402
from dsv4.kernels.fp8_linear import fp8_linear  # noqa: E402
from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16  # noqa: E402

DEV = "cuda"


@triton.jit
def _prefetch_kernel(BASE, COUNT, LAST, SIZE: tl.constexpr, BLOCK: tl.constexpr):
    """Bulk L2 prefetches (`cp.async.bulk.prefetch.L2`) of SIZE bytes each over a tensor's bytes; the
    program ends once they are issued, not when the bytes arrive."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    offs = tl.where(i < COUNT, tl.minimum(i.to(tl.int64) * SIZE, LAST), LAST)
    prefetch_l2(BASE, offs, SIZE)


def prefetch_l2_tensor(t: torch.Tensor, chunk: int, block: int = 128) -> None:
    """Start a contiguous tensor's bytes (its size a multiple of 16, at least `chunk`) into L2."""
    nbytes = t.numel() * t.element_size()
    count = -(-nbytes // chunk)
    _prefetch_kernel[(triton.cdiv(count, block),)](t.view(-1).view(torch.uint8), count, nbytes - chunk,
                                                   SIZE=chunk, BLOCK=block, num_warps=4)


def weights(n: int, k: int, c: int):
    ws = [(torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn) for _ in range(c)]
    ss = [torch.randint(118, 125, (n // 128, k // 128), device=DEV, dtype=torch.uint8).view(torch.float8_e8m0fnu)
          for _ in range(c)]
    return ws, ss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", default="4,8")
    ap.add_argument("--chunks", default="4096,16384,65536")
    ap.add_argument("--cap", type=int, default=12)
    args = ap.parse_args()
    chains = [int(c) for c in args.chain.split(",")]
    chunks = [int(c) for c in args.chunks.split(",")]
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s ({torch.cuda.get_device_name()}), L2 "
          f"{torch.cuda.get_device_properties(0).L2_cache_size / 2**20:.0f} MB", flush=True)
    g, ro, kg = GROUPED["flash"]
    shapes = [(name, n, k) for name, n, k in LINEARS["flash"] if n * k >= 8 << 20] + [("wo_a", g * ro, kg)]
    small = torch.randn(1024, device=DEV)
    side = torch.cuda.Stream()
    print(f"{'linear':8s} {'MB':>5s} {'floor':>6s} {'cold':>6s} {'hot':>6s} {'chain':>6s} {'ch+lin':>7s} "
          + " ".join(f"{'pf' + str(c // 1024) + 'K':>7s}" for c in chunks) + "   (µs per copy)", flush=True)
    for name, n, k in shapes:
        c = copies_for(n * k, args.cap)
        ws, ss = weights(n, k, c)
        if name == "wo_a":
            x = torch.randn(1, g, k, device=DEV).to(torch.bfloat16)
            lin = lambda w, s: grouped_linear_w8a16(x, w, s)  # noqa: E731
        else:
            x = torch.randn(1, k, device=DEV).to(torch.bfloat16)
            lin = lambda w, s: fp8_linear(x, w, s)  # noqa: E731
        cold = graph_us([lambda w=w, s=s: lin(w, s) for w, s in zip(ws, ss)])
        pair = graph_us([lambda w=w, s=s: (lin(w, s), lin(w, s)) for w, s in zip(ws, ss)])
        hot = pair - cold  # graph_us gives µs per call: here two linears
        for steps in chains:
            def chain():
                for _ in range(steps):
                    small.add_(1.0)
            t_chain = graph_us([chain for _ in ws])
            base = graph_us([lambda w=w, s=s: (chain(), lin(w, s)) for w, s in zip(ws, ss)])
            pf = []
            for chunk in chunks:
                def with_prefetch(w, s, chunk=chunk):
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        prefetch_l2_tensor(w, chunk)
                    chain()
                    torch.cuda.current_stream().wait_stream(side)
                    lin(w, s)
                pf.append(graph_us([lambda w=w, s=s: with_prefetch(w, s) for w, s in zip(ws, ss)]))
            print(f"{name:8s} {n * k / 2**20:5.0f} {n * k / (bw * 1e6):6.2f} {cold:6.2f} {hot:6.2f} {t_chain:6.2f} "
                  f"{base:7.2f} " + " ".join(f"{t:7.2f}" for t in pf) + f"   chain of {steps}", flush=True)
        del ws, ss
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
