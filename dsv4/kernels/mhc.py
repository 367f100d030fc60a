"""mHC kernels (spec §2.2, §2.10): pre (RMS-scaled mix + Sinkhorn + collapse), post (expand + mix),
post(prev) fused with pre(next), and the HC head — each beside a torch reference of the same signature.

Two launches per mHC site, whatever the batch:

* `_mix_kernel` (grid: token blocks x D splits) reads the streams X [T, 4, D] once — for the fused
  variant it first forms `X'_k = post_k f + sum_j comb[j, k] X_j`, rounds it to bf16 and stores it —
  and writes split partials of the 24 mixes `fn . flat(X)` and of `sum(X^2)`. The mix runs on the
  tensor cores: X is exactly bf16 and the fp32 `fn` is split into `hi + lo` bf16 halves, so two bf16
  dots with fp32 accumulation reproduce the fp32 product to ~2^-17 relative.
* the finish sums the partials, applies rho and the sigmoids; one program per token runs the
  20-iteration Sinkhorn in the spec's order (row softmax + eps, column step, 19 x (row, column)) and
  writes post/comb, beside the collapse `u = sum_j pre_j X_j` (fp32 -> bf16), optionally followed by
  the sub-layer's weighted RMSNorm (the only consumer of u). Two variants (`collapse=`, default COLLAPSE):
  "row" (`_finish_kernel`): one program walks the token's whole row, twice with a norm -- at T = 1
  that took hc_pre 12.2 -> 10.1 µs on the H200. "split" (`_finish_split_kernel`): one program per
  SPLIT_BD columns; with a norm each stores its chunk's sum of squares and counts its arrival, and the
  token's last program sums the partials (by chunk index: deterministic), re-reads u and writes the
  normed row. Same pre and u bits as "row"; the normed row differs only by the fp32 order of the sum of
  squares (rare 1-ulp flips). The HC head uses the same kernels with 4 mixes, `w = sigmoid(m scale +
  base) + eps`, no Sinkhorn.

`hc` must be 4 (all released models); the kernels name the four streams explicitly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from dsv4.model.hyper import hc_head as _hc_head_model
from dsv4.model.hyper import hc_post as _hc_post_model
from dsv4.model.hyper import hc_pre as _hc_pre_model

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, tl, triton  # noqa: F401
from dsv4.kernels._triton import pdl_kernel, pdl_wait

HC = 4
MIX_PAD = 32  # 24 mixes (pre) or 4 (head), padded to one dot tile
# finish variant when a call does not pick one: "row" or "split" (module docstring). "split" measured faster
# in session 7 (T = 1, µs in a graph): hc_pre 10.4 -> 9.8, hc_post_pre 12.1 -> 11.3, hc_head 9.9 -> 8.0.
COLLAPSE = "split"
SPLIT_BD = 512  # columns per collapse program of the split finish
# token rows per mix program above 16 tokens with the post fused in: it holds X, f and X' tiles at once
# (at 64 rows the fused mix took 735 µs at 8K tokens vs 104 µs without the post, s12d)
FUSED_BT = 32
# prefill (above 16 tokens) launch shape of the mix: rows without the post fused in, columns per step, warps
# and software-pipeline stages (`bench/sweep_mhc_mix.py`; decode sizes keep 16 x 64 on 4 warps)
MIX_BT = 64
MIX_BK = 64
MIX_WARPS = 4
MIX_STAGES = 2
# prefill mixes as the transposed product (`_mix_dot`'s TRANS): hi and lo fn rows stacked into one 64-row
# wgmma tile, the stream tile stored to shared memory once. H200, 8K tokens, µs per call (s14a/s14b,
# `bench/sweep_mhc_mix.py`): hc_post_pre 624 -> 403 (32 x 64 on 2 stages; ptxas at 32 x 32: 128 registers, no
# spills, where the untransposed mix took 255 + spills), hc_pre 261 -> 252
MIX_TRANS = True
NORM_BD = 2048  # columns per step of the split finish's RMSNorm pass (the token's last-arriving program)


class MixWeight(NamedTuple):
    """fn [n_mix, 4D] fp32 split for the tensor cores: hi = bf16(fn), lo = bf16(fn - hi), both [32, 4D]."""

    hi: torch.Tensor
    lo: torch.Tensor
    n_mix: int


def prepare_mix(fn: torch.Tensor) -> MixWeight:
    """Split an fp32 mHC/HC-head `fn` into bf16 hi/lo halves padded to 32 rows (do once per weight)."""
    if fn.dim() != 2 or fn.shape[0] > MIX_PAD:
        raise ValueError(f"mHC fn: expected [n_mix <= {MIX_PAD}, hc*D], got {tuple(fn.shape)}")
    f32 = fn.to(torch.float32)
    hi = torch.zeros(MIX_PAD, fn.shape[1], dtype=torch.bfloat16, device=fn.device)
    lo = torch.zeros_like(hi)
    hi[: fn.shape[0]] = f32.to(torch.bfloat16)
    lo[: fn.shape[0]] = (f32 - hi[: fn.shape[0]].float()).to(torch.bfloat16)
    return MixWeight(hi, lo, fn.shape[0])


# --------------------------------------------------------------------------- torch references


def _rms_norm_ref(u: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    uf = u.float()
    return (weight.float() * uf * torch.rsqrt(uf.square().mean(-1, keepdim=True) + eps)).to(u.dtype)


def hc_pre_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
               sinkhorn_iters: int, hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, 4, D] bf16 -> (u [T, D] bf16 — RMSNorm_w(u) when norm_weight is given —, post [T, 4], comb [T, 4, 4])."""
    u, post, comb = _hc_pre_model(x, fn, base, scale, sinkhorn_iters=sinkhorn_iters, hc_eps=hc_eps,
                                  norm_eps=norm_eps)
    if norm_weight is not None:
        u = _rms_norm_ref(u, norm_weight, norm_eps)
    return u, post, comb


def hc_post_ref(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'_k = post_k f + sum_j comb[j, k] X_j (fp32, rounded to bf16): [T, 4, D]."""
    return _hc_post_model(f, x, post, comb)


def hc_post_pre_ref(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                    fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *, sinkhorn_iters: int,
                    hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None):
    """post of one sub-layer followed by pre of the next: (X', u, post', comb')."""
    x_new = hc_post_ref(f, x, post, comb)
    return (x_new,) + hc_pre_ref(x_new, fn, base, scale, sinkhorn_iters=sinkhorn_iters, hc_eps=hc_eps,
                                 norm_eps=norm_eps, norm_weight=norm_weight)


def hc_head_ref(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
                hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None) -> torch.Tensor:
    """HC head collapse y [T, D] bf16 (then RMSNorm_w(y) when norm_weight is given)."""
    y = _hc_head_model(x, fn, base, scale, hc_eps=hc_eps, norm_eps=norm_eps)
    return _rms_norm_ref(y, norm_weight, norm_eps) if norm_weight is not None else y


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:

    @triton.jit
    def _mix_dot(acc, xk, FH, FL, col0, offs_d, HCD, NP: tl.constexpr, INTERP: tl.constexpr, TRANS: tl.constexpr):
        """acc[BT, NP] += xk[BT, BK] (bf16) . fn[:, col0 + offs_d]^T via the hi/lo bf16 split. TRANS: the same
        product transposed with hi and lo stacked, acc[2 NP, BT] += [hi; lo][:, cols] . xk^T (one 64-row
        wgmma; the kernel adds the halves at the end): the fn tile feeds the MMA from shared memory as loaded
        and the stream tile is stored to shared memory once, where the untransposed dot converts the stream
        tile into its register operand layout through shared memory on every step."""
        if TRANS:
            offs_n = tl.arange(0, 2 * NP)
            row = tl.where(offs_n < NP, offs_n, offs_n - NP)
            ptr = tl.where(offs_n < NP, FH, FL)[:, None] + row[:, None] * HCD + col0 + offs_d[None, :]
            w = tl.load(ptr)
            xt = tl.trans(xk)
            if INTERP:
                xt, w = xt.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(w, xt, acc)
        else:
            offs_n = tl.arange(0, NP)
            ptr = offs_n[None, :] * HCD + col0 + offs_d[:, None]
            hi, lo = tl.load(FH + ptr), tl.load(FL + ptr)
            if INTERP:  # Triton's CPU interpreter multiplies bf16 dot operands as raw bits
                xk, hi, lo = xk.to(tl.float32), hi.to(tl.float32), lo.to(tl.float32)
            acc = tl.dot(xk, lo, tl.dot(xk, hi, acc))
        return acc

    @pdl_kernel
    @triton.jit
    def _mix_kernel(
        X, F, POST, COMB, XOUT, FH, FL, PART, SQ,
        T, D, d_per_split,
        FUSE_POST: tl.constexpr, DO_MIX: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
        INTERP: tl.constexpr, TRANS: tl.constexpr,
    ):
        pdl_wait()
        pid_t = tl.program_id(0)
        pid_s = tl.program_id(1)
        offs_t = pid_t * BT + tl.arange(0, BT)
        tmask = offs_t < T
        HCD = 4 * D
        row = offs_t[:, None] * HCD
        if FUSE_POST:  # per-token post [4] and comb [4, 4] as columns
            p0 = tl.load(POST + offs_t * 4 + 0, mask=tmask, other=0.0)[:, None]
            p1 = tl.load(POST + offs_t * 4 + 1, mask=tmask, other=0.0)[:, None]
            p2 = tl.load(POST + offs_t * 4 + 2, mask=tmask, other=0.0)[:, None]
            p3 = tl.load(POST + offs_t * 4 + 3, mask=tmask, other=0.0)[:, None]
        if TRANS:
            acc = tl.zeros((2 * NP, BT), dtype=tl.float32)
        else:
            acc = tl.zeros((BT, NP), dtype=tl.float32)
        sq = tl.zeros((BT,), dtype=tl.float32)
        d_lo = pid_s * d_per_split
        for i in range(0, d_per_split, BK):
            offs_d = d_lo + i + tl.arange(0, BK)
            m2 = tmask[:, None] & (offs_d[None, :] < D)
            x0 = tl.load(X + row + 0 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            x1 = tl.load(X + row + 1 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            x2 = tl.load(X + row + 2 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            x3 = tl.load(X + row + 3 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            if FUSE_POST:
                f = tl.load(F + offs_t[:, None] * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
                cb = COMB + offs_t * 16
                y0 = p0 * f + (tl.load(cb + 0, mask=tmask, other=0.0)[:, None] * x0
                               + tl.load(cb + 4, mask=tmask, other=0.0)[:, None] * x1
                               + tl.load(cb + 8, mask=tmask, other=0.0)[:, None] * x2
                               + tl.load(cb + 12, mask=tmask, other=0.0)[:, None] * x3)
                y1 = p1 * f + (tl.load(cb + 1, mask=tmask, other=0.0)[:, None] * x0
                               + tl.load(cb + 5, mask=tmask, other=0.0)[:, None] * x1
                               + tl.load(cb + 9, mask=tmask, other=0.0)[:, None] * x2
                               + tl.load(cb + 13, mask=tmask, other=0.0)[:, None] * x3)
                y2 = p2 * f + (tl.load(cb + 2, mask=tmask, other=0.0)[:, None] * x0
                               + tl.load(cb + 6, mask=tmask, other=0.0)[:, None] * x1
                               + tl.load(cb + 10, mask=tmask, other=0.0)[:, None] * x2
                               + tl.load(cb + 14, mask=tmask, other=0.0)[:, None] * x3)
                y3 = p3 * f + (tl.load(cb + 3, mask=tmask, other=0.0)[:, None] * x0
                               + tl.load(cb + 7, mask=tmask, other=0.0)[:, None] * x1
                               + tl.load(cb + 11, mask=tmask, other=0.0)[:, None] * x2
                               + tl.load(cb + 15, mask=tmask, other=0.0)[:, None] * x3)
                b0, b1, b2, b3 = y0.to(tl.bfloat16), y1.to(tl.bfloat16), y2.to(tl.bfloat16), y3.to(tl.bfloat16)
                orow = XOUT + row + offs_d[None, :]
                tl.store(orow + 0 * D, b0, mask=m2)
                tl.store(orow + 1 * D, b1, mask=m2)
                tl.store(orow + 2 * D, b2, mask=m2)
                tl.store(orow + 3 * D, b3, mask=m2)
            else:
                b0, b1, b2, b3 = x0.to(tl.bfloat16), x1.to(tl.bfloat16), x2.to(tl.bfloat16), x3.to(tl.bfloat16)
            if DO_MIX:
                f0, f1, f2, f3 = b0.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32), b3.to(tl.float32)
                sq += tl.sum(f0 * f0 + f1 * f1 + f2 * f2 + f3 * f3, axis=1)
                acc = _mix_dot(acc, b0, FH, FL, 0 * D, offs_d, HCD, NP, INTERP, TRANS)
                acc = _mix_dot(acc, b1, FH, FL, 1 * D, offs_d, HCD, NP, INTERP, TRANS)
                acc = _mix_dot(acc, b2, FH, FL, 2 * D, offs_d, HCD, NP, INTERP, TRANS)
                acc = _mix_dot(acc, b3, FH, FL, 3 * D, offs_d, HCD, NP, INTERP, TRANS)
        if DO_MIX and TRANS:  # the hi and lo halves' sums added: [NP, BT]
            mix = tl.sum(tl.reshape(acc, (2, NP, BT)), axis=0)
            offs_n = tl.arange(0, NP)
            tl.store(PART + (pid_s * T + offs_t[None, :]) * NP + offs_n[:, None], mix, mask=tmask[None, :])
        elif DO_MIX:
            offs_n = tl.arange(0, NP)
            tl.store(PART + (pid_s * T + offs_t[:, None]) * NP + offs_n[None, :], acc, mask=tmask[:, None])
        if DO_MIX:
            tl.store(SQ + pid_s * T + offs_t, sq, mask=tmask)

    @triton.jit
    def _sigmoid(v):
        return 1.0 / (1.0 + tl.exp(-v))

    @triton.jit
    def _post_comb(PART, BASE, SCALE, POST, COMB, t, T, offs_s, smask, rho, hc_eps,
                   ITERS: tl.constexpr, NP: tl.constexpr):
        """post [4] and the Sinkhorn comb [4, 4] of token t, from the split partials of its mixes 4..23."""
        j4 = tl.arange(0, 4)
        part = PART + (offs_s[:, None] * T + t) * NP
        m_post = tl.sum(tl.load(part + 4 + j4[None, :], mask=smask[:, None], other=0.0), axis=0) * rho
        post = 2.0 * _sigmoid(m_post * tl.load(SCALE + 1) + tl.load(BASE + 4 + j4))
        tl.store(POST + t * 4 + j4, post)
        jk = j4[:, None] * 4 + j4[None, :]  # [source j, destination k]
        part3 = PART + (offs_s[:, None, None] * T + t) * NP + 8 + jk[None, :, :]
        m_comb = tl.sum(tl.load(part3, mask=smask[:, None, None], other=0.0), axis=0) * rho
        a = m_comb * tl.load(SCALE + 2) + tl.load(BASE + 8 + jk)
        e = tl.exp(a - tl.max(a, axis=1)[:, None])
        c = e / tl.sum(e, axis=1)[:, None] + hc_eps
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
        for _ in tl.static_range(ITERS - 1):
            c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
            c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
        tl.store(COMB + t * 16 + jk, c)

    @triton.jit
    def _pre_weights(PART, BASE, SCALE, t, T, offs_s, smask, rho, hc_eps, NP: tl.constexpr):
        """pre_j = sigmoid(rho m_j scale_0 + base_j) + eps (also the HC head's w_j), as four scalars."""
        j4 = tl.arange(0, 4)
        m = tl.sum(tl.load(PART + (offs_s[:, None] * T + t) * NP + j4[None, :], mask=smask[:, None], other=0.0),
                   axis=0) * rho
        pre = _sigmoid(m * tl.load(SCALE) + tl.load(BASE + j4)) + hc_eps
        # a masked sum adds exact zeros: each scalar is pre's own value
        return (tl.sum(tl.where(j4 == 0, pre, 0.0), axis=0), tl.sum(tl.where(j4 == 1, pre, 0.0), axis=0),
                tl.sum(tl.where(j4 == 2, pre, 0.0), axis=0), tl.sum(tl.where(j4 == 3, pre, 0.0), axis=0))

    @triton.jit
    def _collapse(xrow, D, offs_d, dm, p0, p1, p2, p3):
        """u = sum_j pre_j X_j over columns offs_d, fp32 -> bf16. An explicit fma chain (not a tl.sum over a
        [4, BD] tile, nor a + b left to LLVM's contraction, both of which follow the layout) so that
        both finish variants round u alike."""
        x0 = tl.load(xrow + 0 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
        x1 = tl.load(xrow + 1 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
        x2 = tl.load(xrow + 2 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
        x3 = tl.load(xrow + 3 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
        return tl.fma(p3, x3, tl.fma(p2, x2, tl.fma(p1, x1, p0 * x0))).to(tl.bfloat16)

    @pdl_kernel
    @triton.jit
    def _finish_kernel(
        X, PART, SQ, BASE, SCALE, NORM_W, U, NORMED, POST, COMB,
        T, D, nsplit, hc_eps, norm_eps,
        HAS_NORM: tl.constexpr, ITERS: tl.constexpr,
        NP: tl.constexpr, SP: tl.constexpr, BD: tl.constexpr,
    ):
        """collapse="row": program (t, 0) collapses token t's whole row, program (t, 1) runs post + Sinkhorn."""
        pdl_wait()
        t = tl.program_id(0)
        offs_s = tl.arange(0, SP)
        smask = offs_s < nsplit
        sq = tl.sum(tl.load(SQ + offs_s * T + t, mask=smask, other=0.0), axis=0)
        rho = 1.0 / tl.sqrt(sq / (4 * D) + norm_eps)
        if tl.program_id(1) == 1:
            _post_comb(PART, BASE, SCALE, POST, COMB, t, T, offs_s, smask, rho, hc_eps, ITERS, NP)
        else:
            p0, p1, p2, p3 = _pre_weights(PART, BASE, SCALE, t, T, offs_s, smask, rho, hc_eps, NP)
            # collapse (fp32 -> bf16), then optionally the sub-layer RMSNorm over the bf16 u
            xrow = X + t * 4 * D
            usq = tl.zeros((BD,), dtype=tl.float32)
            for d0 in range(0, D, BD):
                offs_d = d0 + tl.arange(0, BD)
                dm = offs_d < D
                u = _collapse(xrow, D, offs_d, dm, p0, p1, p2, p3)
                tl.store(U + t * D + offs_d, u, mask=dm)
                uf = u.to(tl.float32)
                usq += uf * uf
            if HAS_NORM:
                r = 1.0 / tl.sqrt(tl.sum(usq, axis=0) / D + norm_eps)
                for d0 in range(0, D, BD):
                    offs_d = d0 + tl.arange(0, BD)
                    dm = offs_d < D
                    u = _collapse(xrow, D, offs_d, dm, p0, p1, p2, p3).to(tl.float32)
                    w = tl.load(NORM_W + offs_d, mask=dm, other=0.0).to(tl.float32)
                    tl.store(NORMED + t * D + offs_d, (w * (u * r)).to(tl.bfloat16), mask=dm)

    @pdl_kernel
    @triton.jit
    def _finish_split_kernel(
        X, PART, SQ, BASE, SCALE, NORM_W, U, NORMED, POST, COMB, USQ, CNT,
        T, D, nsplit, hc_eps, norm_eps,
        HAS_NORM: tl.constexpr, LEAD: tl.constexpr, ITERS: tl.constexpr,
        NP: tl.constexpr, SP: tl.constexpr, BD: tl.constexpr, NBP: tl.constexpr, NBD: tl.constexpr,
    ):
        """collapse="split", grid (T, LEAD + nb): with LEAD = 1 (mHC pre) program (t, 0) runs post + Sinkhorn;
        program (t, LEAD + c) collapses columns [c BD, (c + 1) BD) of token t; with a norm, the token's last
        chunk program to finish normalises the whole row."""
        pdl_wait()
        t = tl.program_id(0)
        c = tl.program_id(1) - LEAD
        nb = tl.num_programs(1) - LEAD
        offs_s = tl.arange(0, SP)
        smask = offs_s < nsplit
        sq = tl.sum(tl.load(SQ + offs_s * T + t, mask=smask, other=0.0), axis=0)
        rho = 1.0 / tl.sqrt(sq / (4 * D) + norm_eps)
        if LEAD == 1:
            if c < 0:
                _post_comb(PART, BASE, SCALE, POST, COMB, t, T, offs_s, smask, rho, hc_eps, ITERS, NP)
        if c >= 0:
            p0, p1, p2, p3 = _pre_weights(PART, BASE, SCALE, t, T, offs_s, smask, rho, hc_eps, NP)
            offs_d = c * BD + tl.arange(0, BD)
            dm = offs_d < D
            u = _collapse(X + t * 4 * D, D, offs_d, dm, p0, p1, p2, p3)
            tl.store(U + t * D + offs_d, u, mask=dm)
            if HAS_NORM:
                uf = u.to(tl.float32)
                tl.store(USQ + t * NBP + c, tl.sum(uf * uf, axis=0))
                # Publish u and the partial, count the arrival (the ordering of fp8_linear's split K: the CTA
                # barrier orders every thread's stores before the one thread's gpu-scope acq_rel atomic; in the
                # last arriver its acquire, then a second barrier, order the .cg (L2) loads after all releases).
                tl.debug_barrier()
                arrived = tl.atomic_add(CNT + t, 1, sem="acq_rel", scope="gpu")
                if arrived == nb - 1:  # uniform over the CTA: the atomic's result is broadcast
                    tl.debug_barrier()
                    # the nb partials by chunk index, one fixed reduction tree: the same bits whoever is last
                    offs_b = tl.arange(0, NBP)
                    part = tl.load(USQ + t * NBP + offs_b, mask=offs_b < nb, other=0.0, cache_modifier=".cg")
                    r = 1.0 / tl.sqrt(tl.sum(part, axis=0) / D + norm_eps)
                    for d0 in range(0, D, NBD):
                        offs_n = d0 + tl.arange(0, NBD)
                        nm = offs_n < D
                        un = tl.load(U + t * D + offs_n, mask=nm, other=0.0, cache_modifier=".cg").to(tl.float32)
                        w = tl.load(NORM_W + offs_n, mask=nm, other=0.0).to(tl.float32)
                        tl.store(NORMED + t * D + offs_n, (w * (un * r)).to(tl.bfloat16), mask=nm)
                    # every chunk of the token has arrived, nothing else touches its counter in this launch
                    tl.store(CNT + t, 0)


# --------------------------------------------------------------------------- launchers


def _require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.mhc: triton is not installed (use the *_ref functions)")


def _check_streams(x: torch.Tensor, name: str = "x") -> tuple[int, int]:
    if x.dim() != 3 or x.shape[1] != HC or x.dtype != torch.bfloat16:
        raise ValueError(f"mHC {name}: expected bf16 [T, {HC}, D], got {x.dtype} {tuple(x.shape)}")
    if x.shape[2] % 16:
        raise ValueError(f"mHC {name}: hidden size {x.shape[2]} must be a multiple of 16")
    return x.shape[0], x.shape[2]


def _pick_split(t: int, d: int, bt: int, bk: int) -> tuple[int, int]:
    """(splits, D columns per split): enough programs to fill the chip at decode sizes."""
    chunks = triton.cdiv(d, bk)
    tblocks = triton.cdiv(t, bt)
    split = 1
    while split * 2 <= chunks and tblocks * split < 264 and chunks % (split * 2) == 0:
        split *= 2
    return split, (chunks // split) * bk


def _as_mix(fn) -> MixWeight:
    return fn if isinstance(fn, MixWeight) else prepare_mix(fn)


def _mix(x: torch.Tensor, fn: MixWeight, fuse: tuple | None, do_mix: bool = True):
    t, d = x.shape[0], x.shape[2]
    prefill = t > 16
    bt = (FUSED_BT if fuse is not None else MIX_BT) if prefill else 16
    bk = min(MIX_BK if prefill else 64, triton.next_power_of_2(d))
    split, per = _pick_split(t, d, bt, bk)
    part = torch.empty(split, t, MIX_PAD, dtype=torch.float32, device=x.device)
    sq = torch.empty(split, t, dtype=torch.float32, device=x.device)
    if fuse is not None:
        f, post, comb = fuse
        xout = torch.empty_like(x)
        f, post, comb = f.contiguous(), post.contiguous().float(), comb.contiguous().float()
    else:
        f = post = comb = xout = x
    _mix_kernel[(triton.cdiv(t, bt), split)](
        x, f, post, comb, xout, fn.hi, fn.lo, part, sq, t, d, per,
        FUSE_POST=fuse is not None, DO_MIX=do_mix, NP=MIX_PAD, BT=bt, BK=bk, INTERP=INTERPRET,
        TRANS=MIX_TRANS and prefill,
        num_warps=MIX_WARPS if prefill else 4, num_stages=MIX_STAGES if prefill else 3,
    )
    return xout, part, sq, split


def _token_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Per-token arrival counters of the split finish with a norm (dsv4.kernels._triton)."""
    return arrival_counters("mHC split finish", device, needed)


def _collapse_mode(collapse: str | None, who: str) -> str:
    mode = COLLAPSE if collapse is None else collapse
    if mode not in ("row", "split"):
        raise ValueError(f"{who}: collapse={mode!r} must be 'row' or 'split'")
    return mode


def _finish(x, part, sq, split, base, scale, norm_weight, head: bool, iters: int, hc_eps: float,
            norm_eps: float, mode: str):
    t, d = x.shape[0], x.shape[2]
    u = torch.empty(t, d, dtype=torch.bfloat16, device=x.device)
    normed = torch.empty_like(u) if norm_weight is not None else u
    post = torch.empty(t, HC, dtype=torch.float32, device=x.device)
    comb = torch.empty(t, HC, HC, dtype=torch.float32, device=x.device)
    args = (x, part, sq, base.float().contiguous(), scale.float().contiguous(),
            norm_weight if norm_weight is not None else u, u, normed, post, comb)
    tail = (t, d, split, float(hc_eps), float(norm_eps))
    kw = dict(HAS_NORM=norm_weight is not None, ITERS=iters, NP=MIX_PAD, SP=max(2, triton.next_power_of_2(split)),
              num_warps=4)
    if mode == "row":
        _finish_kernel[(t, 1 if head else 2)](*args, *tail, BD=min(1024, triton.next_power_of_2(d)), **kw)
    else:
        bd = min(SPLIT_BD, triton.next_power_of_2(d))
        nb = triton.cdiv(d, bd)
        nbp = max(2, triton.next_power_of_2(nb))
        usq = cnt = u  # the norm's per-token partial sums of squares (each written before read) and counters
        if norm_weight is not None:
            usq, cnt = torch.empty(t, nbp, dtype=torch.float32, device=x.device), _token_counters(x.device, t)
        _finish_split_kernel[(t, nb + (0 if head else 1))](
            *args, usq, cnt, *tail, LEAD=0 if head else 1, BD=bd, NBP=nbp,
            NBD=min(NORM_BD, triton.next_power_of_2(d)), **kw)
    return (normed if norm_weight is not None else u), post, comb


def hc_pre(x: torch.Tensor, fn, base: torch.Tensor, scale: torch.Tensor, *, sinkhorn_iters: int,
           hc_eps: float, norm_eps: float, norm_weight: torch.Tensor | None = None, collapse: str | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton mHC pre (contract of `hc_pre_ref`); `fn` is the fp32 weight or a `prepare_mix` result;
    `collapse` picks the finish variant ("row" / "split", default the module's COLLAPSE)."""
    _require_triton()
    mode = _collapse_mode(collapse, "hc_pre")
    _check_streams(x)
    if sinkhorn_iters < 1:
        raise ValueError(f"hc_pre: sinkhorn_iters={sinkhorn_iters} must be >= 1")
    fn = _as_mix(fn)
    if fn.n_mix != (2 + HC) * HC:
        raise ValueError(f"hc_pre: fn has {fn.n_mix} mixes, expected {(2 + HC) * HC}")
    x = x.contiguous()
    _, part, sq, split = _mix(x, fn, None)
    return _finish(x, part, sq, split, base, scale, norm_weight, False, sinkhorn_iters, hc_eps, norm_eps, mode)


def hc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Triton mHC post (contract of `hc_post_ref`): one launch."""
    _require_triton()
    t, d = _check_streams(x)
    if f.shape != (t, d):
        raise ValueError(f"hc_post: f {tuple(f.shape)} does not match x {tuple(x.shape)}")
    dummy = MixWeight(x, x, 0)
    xout, _, _, _ = _mix(x.contiguous(), dummy, (f.to(torch.bfloat16), post, comb), do_mix=False)
    return xout


def hc_post_pre(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn, base: torch.Tensor,
                scale: torch.Tensor, *, sinkhorn_iters: int, hc_eps: float, norm_eps: float,
                norm_weight: torch.Tensor | None = None, collapse: str | None = None):
    """Triton post(prev sub-layer) + pre(next) in two launches (contract of `hc_post_pre_ref`)."""
    _require_triton()
    mode = _collapse_mode(collapse, "hc_post_pre")
    t, d = _check_streams(x)
    if f.shape != (t, d):
        raise ValueError(f"hc_post_pre: f {tuple(f.shape)} does not match x {tuple(x.shape)}")
    fn = _as_mix(fn)
    xout, part, sq, split = _mix(x.contiguous(), fn, (f.to(torch.bfloat16), post, comb))
    return (xout,) + _finish(xout, part, sq, split, base, scale, norm_weight, False, sinkhorn_iters, hc_eps,
                             norm_eps, mode)


def hc_head(x: torch.Tensor, fn, base: torch.Tensor, scale: torch.Tensor, *, hc_eps: float, norm_eps: float,
            norm_weight: torch.Tensor | None = None, collapse: str | None = None) -> torch.Tensor:
    """Triton HC head (contract of `hc_head_ref`), two launches, final RMSNorm fused when given."""
    _require_triton()
    mode = _collapse_mode(collapse, "hc_head")
    _check_streams(x)
    fn = _as_mix(fn)
    if fn.n_mix != HC:
        raise ValueError(f"hc_head: fn has {fn.n_mix} mixes, expected {HC}")
    x = x.contiguous()
    _, part, sq, split = _mix(x, fn, None)
    return _finish(x, part, sq, split, base, scale, norm_weight, True, 1, hc_eps, norm_eps, mode)[0]
