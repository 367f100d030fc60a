"""Manifold-constrained hyper-connections (mHC, spec §2.2) and the HC head (§2.10).

The residual is `hc` parallel streams `X [T, hc, D]`. Around each sub-layer, `hc_pre` derives from X
(in fp32) the collapse weights `pre`, the expand weights `post` and the Sinkhorn-normalised stream mix
`comb`, and collapses X into the sub-layer input; `hc_post` expands the sub-layer output back:
`X'_k = post_k f + sum_j comb[j, k] X_j` (comb is indexed [source j, destination k]).
"""
from __future__ import annotations

import torch

from dsv4.model.numerics import acc_dtype


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Row softmax + eps, column normalisation, then (iters - 1) x (row, column); eps on every sum."""
    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def _mixes(x: torch.Tensor, fn: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """rho * (fn . flat(X)) with rho the unweighted RMS of the flattened streams (fp32)."""
    acc = acc_dtype(x.dtype)
    flat = x.flatten(-2).to(acc)
    rho = torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return (flat @ fn.to(acc).T) * rho


def hc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
           sinkhorn_iters: int, hc_eps: float, norm_eps: float
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, hc, D] -> (collapsed input [T, D] in x.dtype, post [T, hc], comb [T, hc, hc]) (fp32)."""
    hc = x.shape[-2]
    acc = acc_dtype(x.dtype)
    m = _mixes(x, fn, norm_eps)
    base, scale = base.to(acc), scale.to(acc)
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb_logits = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).unflatten(-1, (hc, hc))
    comb = sinkhorn(comb_logits, sinkhorn_iters, hc_eps)
    collapsed = (pre.unsqueeze(-1) * x.to(acc)).sum(dim=-2)
    return collapsed.to(x.dtype), post, comb


def hc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """X'_k = post_k f + sum_j comb[j, k] X_j, in fp32, rounded to x.dtype."""
    acc = post.dtype
    mixed = torch.einsum("tjk,tjd->tkd", comb, x.to(acc))
    return (post.unsqueeze(-1) * f.to(acc).unsqueeze(-2) + mixed).to(x.dtype)


def hc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
            hc_eps: float, norm_eps: float) -> torch.Tensor:
    """Final collapse of the streams: w_j = sigmoid(m_j scale + base_j) + eps, y = sum_j w_j X_j."""
    acc = acc_dtype(x.dtype)
    m = _mixes(x, fn, norm_eps)
    w = torch.sigmoid(m * scale.to(acc) + base.to(acc)) + hc_eps
    return (w.unsqueeze(-1) * x.to(acc)).sum(dim=-2).to(x.dtype)
