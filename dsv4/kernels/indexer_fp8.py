"""The indexer's FP4-simulated rows as e4m3 with one power of two per row, for the prefill scores on FP8 tensor cores
(`indexer_scores.prefill_index_scores(fp4=True)` with `indexer_scores.PREFILL_FP8`, on), beside a torch
reference of the same signature.

Why it is exact: with `simulate_quant` on, every indexer q head and key is Hadamard-rotated and FP4-simulated
(spec 2.6.2), so each value is e2m1 x 2^s with one s per 32-element block. Scaled by 2^-a, a = (exponent of the
row's largest magnitude) - 7, the largest lands in [128, 256) and every value is e4m3-exact as long as the blocks'
scales lie within 2^13 of each other (a block's largest code is 3-6 times its scale, its smallest nonzero 0.5;
e2m1's one mantissa bit; e4m3 reaches 2^-9). Then

    q . k = 2^(a_q + a_k) (q' . k'),    bf16(2^c x) = 2^c bf16(x),    fp32 sums and products likewise,

so the scores' per-head bf16 rounding, relu, weighting and fp32 head sum give the same bits with w' = w 2^(a_q) per
(query, head) and the total times 2^(a_k) per key -- provided the FP8 MMA sums q' . k' as the bf16 MMA sums q . k.
Hopper's does on such operands: `bench/check_fp8_index_dots.py` found no dot of 3 x 8192 x 8192 (Gaussian,
heavy-tailed and widely scaled rows) that differs from the float64 sum, for either MMA (session 71, H100).

A row that does not fold exactly (blocks further apart, a subnormal largest value, a weight scaled out of range)
clears the launch's `ok` flag; the scores then come from the bf16 kernel, which the launcher queues behind the FP8
one with the opposite guard (no host sync: both read the flag on the device, one of them exits at once).

The fold's exactness test reads the fp32 bits (at most 3 mantissa bits, a multiple of 2^-9) rather than comparing the
e4m3 round trip with the value: on the GPU (sessions 71-73, H100) the round trip compared unequal for every row, zero
rows too, though the e4m3 bytes were right, so the flag always read 0; session 73 ran both tests there, and the bits
agreed with the reference everywhere.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, tl, triton  # noqa: F401

FOLD_ROWS = 32  # rows per program of the fold kernel
# rows whose largest magnitude is below 2^-100 do not fold (their scale would leave fp32's range)
MIN_EXPONENT = tl.constexpr(-100) if HAS_TRITON else -100


def fold_rows_ref(x: torch.Tensor, w: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """x [R, D] bf16, w [R] float or None -> (x' e4m3 [R, D], s fp32 [R], ok): x' = x 2^-a with the row's largest
    magnitude in [128, 256) (a = 0 for a zero row) and s = 2^a, or with w, s = w 2^a; ok: every row exact."""
    xf = x.float()
    amax = xf.abs().amax(dim=1)
    exp = torch.frexp(amax)[1] - 1  # amax in [2^exp, 2^(exp + 1))
    a = torch.where(amax > 0, exp - 7, 0)
    scaled = xf * torch.exp2(-a.float())[:, None]
    x8 = scaled.to(torch.float8_e4m3fn)
    ok = (x8.float() == scaled).all(dim=1) & ((amax == 0) | (exp >= int(MIN_EXPONENT)))
    s = torch.exp2(a.float())
    if w is not None:
        s = w.float() * s
        ok &= torch.isfinite(s) & (s * torch.exp2(-a.float()) == w.float())
    return x8, s, bool(ok.all())


if HAS_TRITON:
    @triton.jit
    def _fold_kernel(X, W, X8, S, OK, R, H, sx_t, sx_h, sw_t, sw_h, D: tl.constexpr, BR: tl.constexpr,
                     HAS_W: tl.constexpr):
        """Rows r = t * H + h of X [T, H, D] (strided) -> X8 [R, D] e4m3 and S [R] (2^a, or w 2^a); any row that
        does not fold exactly clears OK."""
        r = tl.program_id(0) * BR + tl.arange(0, BR)
        d = tl.arange(0, D)
        rm = r < R
        t, h = (r // H).to(tl.int64), r % H
        x = tl.load(X + (t * sx_t + h * sx_h)[:, None] + d[None, :], mask=rm[:, None], other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        exp = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # (amax >= 0: no sign bit)
        a = tl.where(amax > 0, exp - 7, 0)
        scaled = x * ((127 - a) << 23).to(tl.float32, bitcast=True)[:, None]  # x 2^-a
        x8 = scaled.to(tl.float8e4nv)
        # e4m3-exact: at most 3 mantissa bits and a multiple of 2^-9 (the row's largest is < 256)
        v = tl.abs(scaled) * 512.0
        exact = ((scaled.to(tl.int32, bitcast=True) & 0xFFFFF) == 0) & (v.to(tl.int32).to(tl.float32) == v)
        ok = (tl.min(exact.to(tl.int32), axis=1) != 0) & ((amax == 0) | (exp >= MIN_EXPONENT))
        s = ((127 + a) << 23).to(tl.float32, bitcast=True)
        if HAS_W:
            w = tl.load(W + t * sw_t + h * sw_h, mask=rm, other=0.0).to(tl.float32)
            ws = w * s
            ok = ok & (tl.abs(ws) < float("inf")) & (ws * ((127 - a) << 23).to(tl.float32, bitcast=True) == w)
            s = ws
        tl.store(X8 + r.to(tl.int64)[:, None] * D + d[None, :], x8, mask=rm[:, None])
        tl.store(S + r, s, mask=rm)
        good = tl.min(tl.where(rm, ok.to(tl.int32), 1), axis=0)
        tl.atomic_min(OK, good)  # (unconditional: 1 keeps the flag, 0 clears it)


def fold_rows(x: torch.Tensor, w: torch.Tensor | None, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `fold_rows_ref` of x [T, H, D] (or [N, D]; last dim contiguous) and w [T, H] (or None) -> (x' e4m3
    [T, H, D] / [N, D] contiguous, s fp32 [T, H] / [N]); a row that does not fold clears ok (int32 [1], 1 before)."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.indexer_fp8: triton is not installed (use fold_rows_ref)")
    x3 = x if x.dim() == 3 else x[:, None, :]
    t, h, d = x3.shape
    x8 = torch.empty(x3.shape, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(t, h, dtype=torch.float32, device=x.device)
    rows = t * h
    if rows:
        sw = (0, 0) if w is None else (w.stride(0), w.stride(1) if w.dim() == 2 else 0)
        _fold_kernel[(triton.cdiv(rows, FOLD_ROWS),)](
            x3, x3 if w is None else w, x8, s, ok, rows, h, x3.stride(0), x3.stride(1), *sw, D=d, BR=FOLD_ROWS,
            HAS_W=w is not None, num_warps=4)
    return x8.view(x.shape), s.view(x.shape[:-1])
