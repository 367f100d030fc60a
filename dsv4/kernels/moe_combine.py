"""The routed MoE's combine: each token's output is the fp32 sum over its top_k slots' expert rows (+ the shared
expert's row), rounded once to the output dtype. The rows come as bf16 [pairs, D] (the Triton downs) or as fp32
partials [R, pairs, D] of them (the persistent down, `moe_glu_decode.down_decode`: each row their sum in range order
rounded to bf16 first, the same bits as storing the bf16 rows). Slots of experts another rank holds are skipped."""
from __future__ import annotations

from contextlib import contextmanager
from typing import NamedTuple

import torch

from dsv4.kernels._triton import HAS_TRITON, pdl_kernel, pdl_wait

# columns per program over fp32 partial rows: 8 x the bytes of bf16 rows per (pair, column), so more, smaller
# programs -- with 1024 (4 programs at one token, each pulling 96 KB through top_k dependent loads) the persistent
# down lost in the MoE call what it gained alone; with 256 it gains there too (session 48)
COMBINE_PARTIALS_BD = 256
COMBINE_BD = 1024  # ... over bf16 rows

if HAS_TRITON:
    import triton
    import triton.language as tl

    @pdl_kernel
    @triton.jit(do_not_specialize=["top_k"])
    def _moe_combine_kernel(Y, S, IDS, OUT, D, top_k, num_experts, stride_r, HAS_SHARED: tl.constexpr,
                            BD: tl.constexpr, RANGES: tl.constexpr = 0):
        pdl_wait()
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BD + tl.arange(0, BD)
        mask = offs < D
        acc = combine_columns(Y, S, IDS, t, offs, mask, D, top_k, num_experts, stride_r, HAS_SHARED, BD, RANGES)
        tl.store(OUT + t * D + offs, acc.to(OUT.dtype.element_ty), mask=mask)

    @triton.jit
    def combine_columns(Y, S, IDS, t, offs, mask, D, top_k, num_experts, stride_r, HAS_SHARED: tl.constexpr,
                        BD: tl.constexpr, RANGES: tl.constexpr):
        """Token t's fp32 sum at columns offs [BD] (`combine_rows` of one token)."""
        rows = t + tl.arange(0, 1)
        return tl.reshape(combine_rows(Y, S, IDS, rows, rows >= 0, offs, mask, D, top_k, num_experts, stride_r,
                                       HAS_SHARED, 1, BD, RANGES), (BD,))

    @triton.jit
    def combine_rows(Y, S, IDS, t, tmask, offs, mask, D, top_k, num_experts, stride_r, HAS_SHARED: tl.constexpr,
                     BT: tl.constexpr, BD: tl.constexpr, RANGES: tl.constexpr):
        """Tokens t's (int64 [BT], tmask) fp32 sums at columns offs [BD] (mask) -> [BT, BD], before the rounding to
        the output dtype; also the mHC sites' load of a deferred combine (`PendingCombine`, `mhc_kernels`' mixes).
        RANGES > 0: Y holds fp32 partials [RANGES, pairs, D] (stride_r apart) of the rows, each row their sum in
        range order from 0.0 rounded to bf16 (`moe_glu_decode.down_decode`), as if stored so first."""
        acc = tl.zeros((BT, BD), dtype=tl.float32)
        m2 = tmask[:, None] & mask[None, :]
        for j in range(top_k):
            e = tl.load(IDS + t * top_k + j, mask=tmask, other=-1)
            here = m2 & ((e >= 0) & (e < num_experts))[:, None]  # else: another rank's expert, row never written
            row = Y + ((t * top_k + j) * D)[:, None] + offs[None, :]
            if RANGES > 0:
                y = tl.zeros((BT, BD), dtype=tl.float32)
                for r in tl.static_range(RANGES):
                    y += tl.load(row + r * stride_r, mask=here, other=0.0)
                acc += y.to(tl.bfloat16).to(tl.float32)
            else:
                acc += tl.load(row, mask=here, other=0.0).to(tl.float32)
        if HAS_SHARED:
            acc += tl.load(S + (t * D)[:, None] + offs[None, :], mask=m2, other=0.0).to(tl.float32)
        return acc


def check_shared(shared: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if shared.shape != shape or shared.dtype != torch.bfloat16:
        raise ValueError(f"fused_moe: shared must be bf16 {tuple(shape)}, got {shared.dtype} {tuple(shared.shape)}")
    return shared


class PendingCombine(NamedTuple):
    """A combine left to its consumer (`deferred`): the mHC site after the MoE sums the rows as it loads them
    (`dsv4.kernels.mhc`, one launch fewer); any other consumer calls `materialize()` (the combine's launch)."""

    y: torch.Tensor
    shared: torch.Tensor | None
    ids: torch.Tensor
    out: torch.Tensor
    num_experts: int

    @property
    def shape(self) -> torch.Size:
        return self.out.shape

    @property
    def ranges(self) -> int:
        return self.y.shape[0] if self.y.dim() == 3 else 0

    def kernel_args(self) -> dict:
        """`combine_columns`' operands as keyword arguments of a kernel that takes them (CY, CS, CIDS, ...)."""
        return dict(CY=self.y, CS=self.shared if self.shared is not None else self.y, CIDS=self.ids,
                    top_k=self.ids.shape[1], num_experts=self.num_experts,
                    stride_r=self.y.stride(0) if self.ranges else 0, COMBINE=True,
                    C_SHARED=self.shared is not None, C_RANGES=self.ranges)

    def materialize(self) -> torch.Tensor:
        return _launch(self)


_deferring = False  # inside `deferred()`: `combine` returns a PendingCombine


@contextmanager
def deferred(enabled: bool = True):
    """Within the block, `combine` leaves its sum to the consumer (a PendingCombine) when enabled."""
    global _deferring
    before, _deferring = _deferring, enabled
    try:
        yield
    finally:
        _deferring = before


def materialized(f):
    """f itself, or a PendingCombine's output (its combine launched now)."""
    return f.materialize() if isinstance(f, PendingCombine) else f


def combine(y: torch.Tensor, shared, ids: torch.Tensor, out: torch.Tensor, num_experts: int):
    """out = fp32 sum over the top_k slots' rows of y (+ shared expert), rounded to out's dtype (inside `deferred`:
    a PendingCombine of it). shared: a tensor, None, or the join of a branch computing it
    (`dsv4.model.side_stream`), called only here. y: bf16 rows [pairs, D], or fp32 partials [R, pairs, D] of them
    (each row their bf16-rounded sum)."""
    if callable(shared):
        shared = check_shared(shared(), out.shape)
    pending = PendingCombine(y, shared, ids, out, num_experts)
    return pending if _deferring else _launch(pending)


def _launch(p: PendingCombine) -> torch.Tensor:
    m, d = p.out.shape
    a = p.kernel_args()
    bd = COMBINE_PARTIALS_BD if p.ranges else COMBINE_BD
    _moe_combine_kernel[(m, triton.cdiv(d, bd))](
        a["CY"], a["CS"], a["CIDS"], p.out, d, a["top_k"], a["num_experts"], a["stride_r"], HAS_SHARED=a["C_SHARED"],
        BD=bd, RANGES=a["C_RANGES"], num_warps=4,
    )
    return p.out
