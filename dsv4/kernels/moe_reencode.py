"""MXFP4 experts re-encoded to FP8 for one large prefill MoE call (`moe_wide.REENCODE`).

At prefill sizes the FP8-expert kernel (Flash-Base's, `fused_moe`'s per-group kernel with e4m3 weights)
runs the same GEMMs on FP8 MMAs in well under the time of the bf16-MMA wide kernel, because FP4 weights
must be widened per token tile there. So for a large call the MXFP4 weights are re-encoded once into an
FP8 copy (one pass over them, memory-bound), which the FP8 kernel then reads.

The re-encode is exact: within one row's 128-wide K block, with b_g the 4 group scale bytes (E8M0) and
bmax their largest, a weight e2m1 * 2^(b_g - 127) is stored as the e4m3 value e2m1 * 2^(6 - (bmax - b_g)) with
the block scale 2^(bmax - 133). That holds while every bmax - b_g <= 11 and bmax >= 7
(`PackedExperts.fp8_ok`, the same condition as `moe_wide_fp8`'s). The scales are per row and K block
([E, N, K/128] float32), not per 128x128 tile: MXFP4 rows do not share scales.

Numerics of the GEMMs on the copy: the products are the reference's exactly; the FP8 MMA sums each 128-wide
K block in the tensor core's accumulator and the block is promoted in fp32 with both scales (as the FP8
block linears do), so outputs match the reference statistically, not bit for bit (tests/gpu/test_moe_wide.py).
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton
from dsv4.kernels.moe_layout import BLOCK, PackedExperts

if HAS_TRITON:
    from dsv4.kernels.moe import _fp4_hi, _fp4_lo

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def reencode_fp8_ref(w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference: repacked MXFP4 rows w uint8 [..., N, K/2] (`repack_fp4` order) and packed group
    scales s int32 [..., N, K/128] -> e4m3 [..., N, K] in natural K order and float32 scales [..., N, K/128]."""
    b = w.view(torch.uint8)
    k = b.shape[-1] * 2
    b = b.reshape(*b.shape[:-1], k // 64, 32)
    codes = torch.stack((b & 0xF, b >> 4), dim=-2).reshape(*b.shape[:-2], k)  # per 64: lo nibbles, then hi
    mag = torch.tensor(_E2M1, dtype=torch.float32, device=w.device)[(codes & 7).long()]
    val = torch.where(codes >= 8, -mag, mag)
    sb = s.contiguous().view(torch.uint8).reshape(*s.shape, 4).to(torch.int32)  # byte g = group g
    bmax = sb.amax(-1)
    shift = (6 - (bmax[..., None] - sb)).repeat_interleave(32, dim=-1).reshape(*s.shape[:-1], k)
    q = (val * torch.exp2(shift.to(torch.float32))).to(torch.float8_e4m3fn)
    return q, torch.exp2((bmax - 133).to(torch.float32))


if HAS_TRITON:

    @triton.jit
    def _reencode_kernel(W, S, OUT, OS, n_rows, KB, RB: tl.constexpr, USE_ASM: tl.constexpr):
        """One program: RB rows x one 128-wide K block. Each repacked 64-byte block holds groups 0/1 in the
        low/high nibbles of its first 32 bytes and groups 2/3 in those of the next 32."""
        rows = (tl.program_id(0) * RB + tl.arange(0, RB)).to(tl.int64)
        kb = tl.program_id(1)
        mask = rows < n_rows
        j = tl.arange(0, 32)
        sc = tl.load(S + rows * KB + kb, mask=mask, other=0)
        bmax = tl.maximum(tl.maximum(sc & 0xFF, (sc >> 8) & 0xFF), tl.maximum((sc >> 16) & 0xFF, (sc >> 24) & 0xFF))
        tl.store(OS + rows * KB + kb, ((bmax - 6) << 23).to(tl.float32, bitcast=True), mask=mask)
        for h in tl.static_range(2):
            byt = tl.load(W + rows[:, None] * (KB * 64) + kb * 64 + h * 32 + j[None, :], mask=mask[:, None], other=0)
            for part in tl.static_range(2):
                g: tl.constexpr = 2 * h + part
                if part == 0:
                    v = _fp4_lo(byt, USE_ASM)  # e4m3 holding e2m1 * 2^-6
                else:
                    v = _fp4_hi(byt, USE_ASM)
                d = bmax - ((sc >> (8 * g)) & 0xFF)
                f = ((139 - d) << 23).to(tl.float32, bitcast=True)  # 2^(12 - d)
                q = (v.to(tl.float32) * f[:, None]).to(tl.float8e4nv)
                tl.store(OUT + rows[:, None] * (KB * 128) + kb * 128 + g * 32 + j[None, :], q, mask=mask[:, None])


def reencode_fp8(w: torch.Tensor, s: torch.Tensor, rows_per_program: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """`reencode_fp8_ref`'s contract on the GPU (one memory-bound pass)."""
    *lead, n, half = w.shape
    kb = half * 2 // BLOCK
    if tuple(s.shape) != (*lead, n, kb) or s.dtype != torch.int32 or not (w.is_contiguous() and s.is_contiguous()):
        raise ValueError(f"reencode_fp8: expected contiguous uint8 w [..., N, K/2] and int32 s [..., N, K/128], got "
                         f"{w.dtype} {tuple(w.shape)} / {s.dtype} {tuple(s.shape)}")
    q = torch.empty((*lead, n, kb * BLOCK), dtype=torch.float8_e4m3fn, device=w.device)
    qs = torch.empty((*lead, n, kb), dtype=torch.float32, device=w.device)
    rows = q.numel() // (kb * BLOCK)
    _reencode_kernel[(triton.cdiv(rows, rows_per_program), kb)](w, s, q, qs, rows, kb, RB=rows_per_program,
                                                                 USE_ASM=not INTERPRET, num_warps=4)
    return q, qs


def reencoded_experts(experts: PackedExperts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w13, w13 scales, w2, w2 scales) as FP8 with per-row block scales, for one call (not kept: the copy is
    twice the MXFP4 bytes)."""
    if experts.fmt != "mxfp4" or not experts.fp8_ok:
        raise ValueError("reencoded_experts: needs MXFP4 experts whose blocks re-encode exactly (PackedExperts.fp8_ok)")
    w13, s13 = reencode_fp8(experts.w13, experts.w13_scale)
    w2, s2 = reencode_fp8(experts.w2, experts.w2_scale)
    return w13, s13, w2, s2
