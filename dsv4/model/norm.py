"""RMS norms: weighted (`RMSNorm_w`) and the unweighted per-head q norm (spec §0, §2.3)."""
from __future__ import annotations

import torch
from torch import nn

from dsv4.model.numerics import acc_dtype


class RMSNorm(nn.Module):
    """`w * x / sqrt(mean(x^2) + eps)` in fp32 (fp64 for a float64 model), result in the input dtype."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm` as a function: fp32 math (fp64 for float64), result in x's dtype."""
    acc = acc_dtype(x.dtype)
    xf = x.to(acc)
    xf = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (weight.to(acc) * xf).to(x.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-vector RMS norm without weight, in the input dtype's arithmetic (the reference runs the
    per-head q norm on the bf16 tensor)."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
