"""Clamped SwiGLU on a fused gate/up GEMM output (the shared expert's epilogue) as one Triton launch.

`swiglu(gate_up [..., 2I] bf16, limit, weight=None) -> z [..., I] bf16`, with gate = the first I
columns and up = the last I (w1 and w3 stacked row-wise into one weight, see `Expert.fuse_w13`):

    z = bf16( w * silu(min(gate, L)) * clamp(up, -L, L) )     (fp32 math, w = per-row weight or 1)

`swiglu_ref` is the same in torch. On CUDA the kernel does the fp32 math of torch's `F.silu`
exactly: `x / (1 + expf(-x))` with the CUDA math library's expf (libdevice, FTZ off, as torch is
built) and a correctly rounded division, the clamps NaN-propagating like `torch.clamp`, no FMA
contraction, round-to-nearest-even to bf16. Triton's CPU interpreter has no libdevice and truncates
fp32 -> bf16 casts: there the exp is numpy's (an fp32 ulp off at times) and the rounding is done on
the bits, for developer checks only.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton
from dsv4.kernels._triton import pdl_kernel, pdl_wait

BLOCK_I = 1024  # columns per program: decode rows (I = 2048..3072) take 2-3 programs each


# --------------------------------------------------------------------------- torch reference

def swiglu_ref(gate_up: torch.Tensor, limit: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Torch `swiglu`: bf16 [..., I] from gate_up [..., 2I], silu written as torch computes it."""
    i = _check(gate_up, weight)
    gate = gate_up[..., :i].float().clamp(max=limit)
    up = gate_up[..., i:].float().clamp(-limit, limit)
    z = gate / (1.0 + torch.exp(-gate)) * up
    if weight is not None:
        z = weight.float().unsqueeze(-1) * z
    return z.to(torch.bfloat16)


def _check(gate_up: torch.Tensor, weight: torch.Tensor | None) -> int:
    if gate_up.dtype != torch.bfloat16 or gate_up.dim() < 1 or gate_up.shape[-1] % 2:
        raise ValueError(f"swiglu: gate_up must be bf16 [..., 2I], got {gate_up.dtype} {tuple(gate_up.shape)}")
    if weight is not None:
        if weight.dtype not in (torch.float32, torch.bfloat16) or tuple(weight.shape) != tuple(gate_up.shape[:-1]):
            raise ValueError(f"swiglu: weight must be fp32/bf16 of shape {tuple(gate_up.shape[:-1])}, "
                             f"got {weight.dtype} {tuple(weight.shape)}")
        if weight.device != gate_up.device:
            raise ValueError(f"swiglu: weight on {weight.device}, gate_up on {gate_up.device}")
    return gate_up.shape[-1] // 2


# --------------------------------------------------------------------------- Triton kernel

if HAS_TRITON:
    from dsv4.kernels.fp8_linear import _to_bf16
    from triton.language.extra import libdevice

    @pdl_kernel
    @triton.jit(do_not_specialize=["M", "limit"])
    def _swiglu_kernel(GU, W, Z, M, I, stride_gm, stride_zm, limit,
                       HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr):
        pdl_wait()
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < I
        g = tl.load(GU + row * stride_gm + cols, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(GU + row * stride_gm + I + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.where(g > limit, limit, g)  # torch.clamp: NaN stays NaN (tl.minimum would drop it)
        u = tl.where(u > limit, limit, tl.where(u < -limit, -limit, u))
        if INTERP:
            e = tl.exp(-g)
        else:
            e = libdevice.exp(-g)
        z = tl.div_rn(g, 1.0 + e) * u
        if HAS_WEIGHT:
            z = tl.load(W + row).to(tl.float32) * z
        tl.store(Z + row * stride_zm + cols, _to_bf16(z, INTERP), mask=mask)


def swiglu(gate_up: torch.Tensor, limit: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Triton `swiglu_ref`: one launch, no host syncs (CUDA-graph capturable)."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.swiglu.swiglu needs triton")
    i = _check(gate_up, weight)
    lead = gate_up.shape[:-1]
    gu = gate_up.reshape(-1, 2 * i)
    if gu.stride(-1) != 1:
        gu = gu.contiguous()
    m = gu.shape[0]
    z = torch.empty((m, i), dtype=torch.bfloat16, device=gate_up.device)
    if m == 0 or i == 0:
        return z.view(*lead, i)
    w = weight.reshape(-1).contiguous() if weight is not None else gu
    _swiglu_kernel[(m, triton.cdiv(i, BLOCK_I))](
        gu, w, z, m, i, gu.stride(0), z.stride(0), float(limit),
        HAS_WEIGHT=weight is not None, BLOCK=BLOCK_I, INTERP=INTERPRET,
        num_warps=4, enable_fp_fusion=False, enable_reflect_ftz=False)
    return z.view(*lead, i)
