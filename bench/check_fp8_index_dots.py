"""Can the indexer's prefill scores run on FP8 tensor cores without changing a score? (a check, not a benchmark)

The indexer's q and keys are Hadamard-rotated and FP4-simulated (spec 2.6.2): every value is e2m1 x 2^s with one
power of two s per 32-element block. Scaled by one power of two per 128-d vector (`fold`), such a vector is exact
in e4m3 when its blocks' exponents lie within 14 of each other, so q . k = 2^(a + b) * (q' . k') with e4m3
operands. Whether Hopper's FP8 MMA sums those products as the bf16 MMA (today's kernel) does is a property of the
hardware's accumulator, which this measures: the share of dots that differ from the exact (float64) sum, in fp32
and after the bf16 rounding that the scores apply, for the two MMAs, on Gaussian and heavy-tailed vectors.

    python bench/check_fp8_index_dots.py [--rows 8192] [--keys 8192]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dsv4.model.numerics import simulate_indexer_fp4  # noqa: E402


@triton.jit
def _dots(Q, K, OUT, N, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    d = tl.arange(0, D)
    q = tl.load(Q + m[:, None] * D + d[None, :])
    k = tl.load(K + n[:, None] * D + d[None, :])
    tl.store(OUT + m[:, None] * N + n[None, :], tl.dot(q, tl.trans(k)))


def dots(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    _dots[(q.shape[0] // 64, k.shape[0] // 128)](q, k, out, k.shape[0], BM=64, BN=128, D=q.shape[1], num_warps=4)
    return out


def fold(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [R, D] FP4-simulated -> (e4m3 x * 2^-a, 2^a [R], exact [R]): the row's largest magnitude in [128, 256)."""
    amax = x.float().abs().amax(dim=1).clamp_min(2.0 ** -100)
    a = torch.floor(torch.log2(amax)) - 7
    scaled = x.float() * torch.exp2(-a)[:, None]
    f8 = scaled.to(torch.float8_e4m3fn)
    return f8, torch.exp2(a), (f8.float() == scaled).all(dim=1)


def sample(rows: int, d: int, kind: str, dev) -> torch.Tensor:
    x = torch.randn(rows, d, device=dev)
    if kind == "heavy":  # a few large channels, as real activations have, before the rotation
        x = x * torch.where(torch.rand(d, device=dev) < 0.05, 20.0, 1.0)
    if kind == "scaled":  # rows of very different magnitudes
        x = x * torch.exp2(torch.randint(-20, 20, (rows, 1), device=dev).float())
    return simulate_indexer_fp4(x.to(torch.bfloat16))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--keys", type=int, default=8192)
    args = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # (cpu: TRITON_INTERPRET=1)
    torch.manual_seed(0)
    print(f"{'data':8s} {'fold ok q/k':>12s} {'bf16 fp32!=':>12s} {'fp8 fp32!=':>12s} {'bf16 bf16!=':>12s} "
          f"{'fp8 bf16!=':>12s} {'fp8!=bf16mma':>13s} {'max rel fp8':>12s}")
    for kind in ("gauss", "heavy", "scaled"):
        q, k = sample(args.rows, 128, kind, dev), sample(args.keys, 128, kind, dev)
        exact = (q.double() @ k.double().T)
        ref32 = exact.float()
        mma16 = dots(q, k)
        fq, sq, okq = fold(q)
        fk, sk, okk = fold(k)
        mma8 = dots(fq, fk) * sq[:, None] * sk[None, :]
        valid = okq[:, None] & okk[None, :]
        n = valid.sum().item()

        def share(a, b):
            return ((a != b) & valid).sum().item() / max(n, 1)
        rel = ((mma8.double() - exact).abs() / exact.abs().clamp_min(1e-30))[valid & (exact != 0)]
        print(f"{kind:8s} {okq.float().mean().item():6.4f}/{okk.float().mean().item():.4f} "
              f"{share(mma16, ref32):12.2e} {share(mma8, ref32):12.2e} "
              f"{share(mma16.bfloat16(), ref32.bfloat16()):12.2e} {share(mma8.bfloat16(), ref32.bfloat16()):12.2e} "
              f"{share(mma8, mma16):13.2e} {rel.max().item():12.2e}")


if __name__ == "__main__":
    main()
