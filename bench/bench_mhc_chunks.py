"""The prefill mHC sites chunk by chunk (`dsv4.kernels.mhc.PREFILL_CHUNK`): µs per site call (CUDA graph of
`--calls` calls) for each chunk size against one mix + one finish over all tokens (0), rounds interleaved so that
each ratio compares neighbours; the same run's ceilings (copy bandwidth, bf16 matmul) first.

    python bench/bench_mhc_chunks.py [--tokens 8192,16384] [--chunks 0,512,1024,2048] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_engine_step import _ceilings  # noqa: E402
from sweep_mhc_mix import graph_us  # noqa: E402

from dsv4.kernels import mhc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="8192,16384")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--chunks", default="0,512,1024,2048")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    _ceilings(True)
    d, dev = args.hidden, torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    fn = mhc.prepare_mix(torch.randn(24, 4 * d, device=dev, generator=g) * (2.0 / (4 * d) ** 0.5))
    base, scale = torch.randn(24, device=dev, generator=g) * 0.5, torch.rand(3, device=dev, generator=g) + 0.5
    norm_w = (torch.rand(d, device=dev, generator=g) + 0.5).to(torch.bfloat16)
    kw = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6, norm_weight=norm_w)
    chunks = [int(c) for c in args.chunks.split(",")]
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, 4, d, device=dev, generator=g).to(torch.bfloat16)
        f = torch.randn(t, d, device=dev, generator=g).to(torch.bfloat16)
        post = torch.rand(t, 4, device=dev, generator=g) * 2
        comb = torch.rand(t, 4, 4, device=dev, generator=g) / 4
        # bytes of one site: the mix reads X (and f) and writes X' (fused), the finish reads X' and writes the row
        ops = {"hc_post_pre": (lambda: mhc.hc_post_pre(f, x, post, comb, fn, base, scale, **kw), 14 * t * d * 2),
               "hc_pre": (lambda: mhc.hc_pre(x, fn, base, scale, **kw), 9 * t * d * 2)}
        for op, (call, nbytes) in ops.items():
            us = {c: [] for c in chunks}
            for _ in range(args.rounds):
                for c in chunks:
                    mhc.PREFILL_CHUNK = c
                    us[c].append(graph_us(call, args.calls))
            mhc.PREFILL_CHUNK = 0
            base_us = min(us[chunks[0]])
            cells = "  ".join(f"{c}: {min(v):7.1f} µs ({nbytes / min(v) / 1e3:4.0f} GB/s, "
                              f"{base_us / min(v):.3f}x)" for c, v in us.items())
            print(f"{op} T={t}: {cells}", flush=True)


if __name__ == "__main__":
    main()
