"""The epilogue of a layer's fused bf16 projections of the attention input (kernel mode), beside the
torch reference of the same signature.

Kernel mode runs every bf16 linear that reads the attention input `a` -- the compressors' wkv and
wgate, the indexer's weights_proj -- as one GEMM into fp32 over their row-stacked weights
(`Attention.fused_input_weight`). This launch finishes that output `y` [T, N] the way the separate
modules do:

    gate columns     y[:, col:col+w] += ape[pos mod r]     (in place, fp32: `Compressor.project`)
    head weights     bf16(bf16(y[:, col:col+n]) * scale)   (a new tensor: `weights_proj(a) * weight_scale`)

Both are elementwise on the same fp32 values as the torch path, so results are bit-identical given the
same `y`. (Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding: 1 ulp off there.)
"""
from __future__ import annotations

from typing import Sequence

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton  # noqa: F401

Gate = tuple[int, torch.Tensor]              # (first column, ape fp32 [ratio, width])
HeadWeights = tuple[int, int, float]         # (first column, number of heads, scale)
COL_BLOCK = 256


def finish_projections_ref(y: torch.Tensor, positions: torch.Tensor, gates: Sequence[Gate],
                           head_weights: HeadWeights | None = None) -> torch.Tensor | None:
    """y fp32 [T, N] (updated in place), positions int [T] (>= 0). Adds ape[positions mod ratio] to
    each gate's columns; returns the bf16 head weights [T, n] (None without `head_weights`)."""
    for col, ape in gates:
        y[:, col:col + ape.shape[1]] += ape[positions % ape.shape[0]]
    if head_weights is None:
        return None
    col, n, scale = head_weights
    return y[:, col:col + n].to(torch.bfloat16) * scale


if HAS_TRITON:

    @triton.jit
    def _add_ape(ROW, APE, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
        for c0 in tl.static_range(0, WIDTH, BLOCK):
            cols = c0 + tl.arange(0, BLOCK)
            m = cols < WIDTH
            z = tl.load(ROW + cols, mask=m)
            tl.store(ROW + cols, z + tl.load(APE + cols, mask=m), mask=m)

    @triton.jit
    def _finish_kernel(Y, POS, APE0, APE1, W_OUT, stride_y, scale,
                       COL0: tl.constexpr, WIDTH0: tl.constexpr, R0: tl.constexpr,
                       COL1: tl.constexpr, WIDTH1: tl.constexpr, R1: tl.constexpr,
                       COLW: tl.constexpr, NW: tl.constexpr, NWP: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        pos = tl.load(POS + t).to(tl.int64)
        row = Y + t * stride_y
        if WIDTH0 > 0:
            _add_ape(row + COL0, APE0 + (pos % R0) * WIDTH0, WIDTH0, BLOCK)
        if WIDTH1 > 0:
            _add_ape(row + COL1, APE1 + (pos % R1) * WIDTH1, WIDTH1, BLOCK)
        if NW > 0:
            h = tl.arange(0, NWP)
            m = h < NW
            w = tl.load(row + COLW + h, mask=m).to(tl.bfloat16).to(tl.float32) * scale  # torch: bf16 * float in fp32
            tl.store(W_OUT + t * NW + h, w.to(tl.bfloat16), mask=m)


def finish_projections(y: torch.Tensor, positions: torch.Tensor, gates: Sequence[Gate],
                       head_weights: HeadWeights | None = None) -> torch.Tensor | None:
    """Triton `finish_projections_ref` (up to two gates): one launch, one program per token."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.projections: triton is not installed (use finish_projections_ref)")
    if y.dim() != 2 or y.dtype != torch.float32 or y.stride(1) != 1:
        raise ValueError(f"finish_projections: y must be fp32 [T, N] with unit column stride, got {y.dtype} "
                         f"{tuple(y.shape)} strides {y.stride()}")
    t, n_cols = y.shape
    if positions.shape != (t,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"finish_projections: positions must be int [{t}], got {positions.dtype} "
                         f"{tuple(positions.shape)}")
    if len(gates) > 2:
        raise ValueError(f"finish_projections: at most two gates, got {len(gates)}")
    spans = []
    for i, (col, ape) in enumerate(gates):
        if ape.dtype != torch.float32 or ape.dim() != 2 or not ape.is_contiguous() or ape.device != y.device:
            raise ValueError(f"finish_projections: gates[{i}] ape must be contiguous fp32 [ratio, width] on "
                             f"{y.device}, got {ape.dtype} {tuple(ape.shape)} on {ape.device}")
        spans.append((col, ape.shape[1], f"gates[{i}]"))
    if head_weights is not None:
        spans.append((head_weights[0], head_weights[1], "head_weights"))
    for col, width, what in spans:
        if col < 0 or col + width > n_cols:
            raise ValueError(f"finish_projections: {what} columns [{col}, {col + width}) outside y's {n_cols}")
    dummy = y  # stands in for absent tensors (never read: their widths are 0); allocates nothing
    meta, ptrs = {}, []
    for i, (col, ape) in enumerate((list(gates) + [(0, None), (0, None)])[:2]):
        meta |= {f"COL{i}": col, f"WIDTH{i}": 0 if ape is None else ape.shape[1],
                 f"R{i}": 1 if ape is None else ape.shape[0]}
        ptrs.append(dummy if ape is None else ape)
    col_w, n_w, scale = head_weights if head_weights is not None else (0, 0, 1.0)
    w_out = torch.empty(t, n_w, dtype=torch.bfloat16, device=y.device) if head_weights is not None else None
    if t:
        _finish_kernel[(t,)](y, positions.contiguous(), *ptrs, dummy if w_out is None else w_out, y.stride(0),
                             float(scale), **meta, COLW=col_w, NW=n_w, NWP=triton.next_power_of_2(max(n_w, 1)),
                             BLOCK=COL_BLOCK, num_warps=4)
    return w_out
