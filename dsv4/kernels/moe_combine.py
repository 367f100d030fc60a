"""The routed MoE's combine: each token's output is the fp32 sum over its top_k slots' expert rows (+ the shared
expert's row), rounded once to the output dtype. The rows come as bf16 [pairs, D] (the Triton downs) or as fp32
partials [R, pairs, D] of them (the persistent down, `moe_glu_decode.down_decode`: each row their sum in range order
rounded to bf16 first, the same bits as storing the bf16 rows). Slots of experts another rank holds are skipped."""
from __future__ import annotations

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
        """RANGES > 0: Y holds fp32 partials [RANGES, pairs, D] (stride_r apart) of the rows, each row their sum in
        range order from 0.0 rounded to bf16 (`moe_glu_decode.down_decode`), as if stored so first."""
        pdl_wait()
        t = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BD + tl.arange(0, BD)
        mask = offs < D
        acc = tl.zeros((BD,), dtype=tl.float32)
        for j in range(top_k):
            e = tl.load(IDS + t * top_k + j)
            here = (e >= 0) & (e < num_experts)  # else: computed by another rank, row never written
            row = Y + (t * top_k + j) * D + offs
            if RANGES > 0:
                y = tl.zeros((BD,), dtype=tl.float32)
                for r in tl.static_range(RANGES):
                    y += tl.load(row + r * stride_r, mask=mask & here, other=0.0)
                acc += y.to(tl.bfloat16).to(tl.float32)
            else:
                acc += tl.load(row, mask=mask & here, other=0.0).to(tl.float32)
        if HAS_SHARED:
            acc += tl.load(S + t * D + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + t * D + offs, acc.to(OUT.dtype.element_ty), mask=mask)


def check_shared(shared: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    if shared.shape != shape or shared.dtype != torch.bfloat16:
        raise ValueError(f"fused_moe: shared must be bf16 {tuple(shape)}, got {shared.dtype} {tuple(shared.shape)}")
    return shared


def combine(y: torch.Tensor, shared, ids: torch.Tensor, out: torch.Tensor, num_experts: int) -> torch.Tensor:
    """out = fp32 sum over the top_k slots' rows of y (+ shared expert), rounded to out's dtype. shared: a
    tensor, None, or the join of a branch computing it (`dsv4.model.side_stream`), called only here. y: bf16 rows
    [pairs, D], or fp32 partials [R, pairs, D] of them (each row their bf16-rounded sum)."""
    if callable(shared):
        shared = check_shared(shared(), out.shape)
    m, d = out.shape
    ranges = y.shape[0] if y.dim() == 3 else 0
    bd = COMBINE_PARTIALS_BD if ranges else COMBINE_BD
    _moe_combine_kernel[(m, triton.cdiv(d, bd))](
        y, shared if shared is not None else y, ids, out, d, ids.shape[1], num_experts, y.stride(0) if ranges else 0,
        HAS_SHARED=shared is not None, BD=bd, RANGES=ranges, num_warps=4,
    )
    return out
