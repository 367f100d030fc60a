"""Operands of the decode MoE's tensor-core group sums (method "mma" of dsv4.kernels.moe_gemv, whose docstring
gives the math): MXFP4 nibbles as exact f16 values, the weight bytes in the MMA's K order, the block-diagonal
activation tiles (column 4u + g: group g of K block u of a loop step) and the per-column group scales; the x
quantisation block both the GLU and the router write (`quant16_block`) and the host check of its buffers; the GLU
epilogue that both decode GLUs end in (`_glu_out`)."""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON
from dsv4.kernels.moe_layout import BLOCK

# e2m1 nibbles -> f16 (e2m1 * 2^-14), 4 bytes per call (`method="mma"`). An f16 with bits (s << 15) |
# (c << 9) has zero low byte and high byte (s << 7) | (c << 1): build those 4 high bytes in one word
# (shifts + one lop3), then spread them into two f16x2 words with prmt ($0: bytes 0, 1; $1: bytes 2, 3).
F16_LO_PTX = ("{ .reg .b32 t0, t1; shl.b32 t0, $2, 1; shl.b32 t1, $2, 4; and.b32 t1, t1, 0x80808080; "
              "lop3.b32 t0, t0, 0x0E0E0E0E, t1, 0xEA; prmt.b32 $0, t0, 0, 0x1404; prmt.b32 $1, t0, 0, 0x3424; }")
F16_HI_PTX = ("{ .reg .b32 t0, t1; shr.u32 t0, $2, 3; and.b32 t1, $2, 0x80808080; "
              "lop3.b32 t0, t0, 0x0E0E0E0E, t1, 0xEA; prmt.b32 $0, t0, 0, 0x1404; prmt.b32 $1, t0, 0, 0x3424; }")

if HAS_TRITON:
    import triton
    import triton.language as tl

    from dsv4.kernels.fp8_linear import _quant_rows

    _F16_LO_ASM = tl.constexpr(F16_LO_PTX)
    _F16_HI_ASM = tl.constexpr(F16_HI_PTX)

    @triton.jit
    def _f16_lo(b, USE_ASM: tl.constexpr):
        """Low nibbles (e2m1 codes) of uint8 bytes -> f16 e2m1 * 2^-14 (exact bit move)."""
        if USE_ASM:
            return tl.inline_asm_elementwise(_F16_LO_ASM, "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4)
        else:
            v = b.to(tl.int32)
            v = ((v & 7) << 9) | ((v & 8) << 12)
            return v.to(tl.uint16).to(tl.float16, bitcast=True)

    @triton.jit
    def _f16_hi(b, USE_ASM: tl.constexpr):
        """High nibbles of uint8 bytes -> f16 e2m1 * 2^-14."""
        if USE_ASM:
            return tl.inline_asm_elementwise(_F16_HI_ASM, "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4)
        else:
            v = b.to(tl.int32)
            v = (((v >> 4) & 7) << 9) | ((v & 0x80) << 8)
            return v.to(tl.uint16).to(tl.float16, bitcast=True)

    @triton.jit
    def _mma_order(b, BN: tl.constexpr, KD: tl.constexpr):
        """[BN, 64 KD] weight bytes (KD K blocks) -> the MMA's K order: K index k = 64u + 16c + 8h + 2t + i
        takes byte 64u + 32h + 8t + 2c + i, so that each thread of the f16 wgmma A fragment (k pairs 2t, 2t+1
        and 2t+8, 2t+9 of each 16-wide chunk c) converts 8 contiguous bytes per row, u and h (a register-only
        permutation: Triton keeps it in the dot operand layout and reads shared memory 8 bytes at a time)."""
        b = tl.reshape(b, (BN, KD, 2, 4, 4, 2))  # (row, u, h, t, c, i)
        b = tl.permute(b, (0, 1, 4, 2, 3, 5))  # (row, u, c, h, t, i)
        return tl.reshape(b, (BN, 64 * KD))

    @triton.jit
    def _act_tiles(Arow, kb, u0: tl.constexpr, KD: tl.constexpr):
        """Block-diagonal f16 activation tiles [64 KD, 16] for the low / high nibbles of K blocks kb .. kb+KD-1
        (u0 + their index: their place in the scale step), in the K order of `_mma_order` (the activation rows
        are stored permuted that way, `_quant16_kernel`): row k carries its element in column 4u + g (g: its
        32-group in block u), zero elsewhere. Masked loads: the pipeliner's cp.async fills the zeros."""
        k = tl.arange(0, 64 * KD)
        n = tl.arange(0, 16)
        col = 4 * (u0 + k // 64) + 2 * ((k // 8) % 2)  # low nibbles: group 0 (h = 0) or 2 (h = 1)
        ptr = Arow + kb * 128 + (k // 64) * 128 + (k % 64)
        ptr = ptr[:, None] + n[None, :] * 0
        lo = tl.load(ptr, mask=n[None, :] == col[:, None], other=0.0)
        hi = tl.load(ptr + 64, mask=n[None, :] == col[:, None] + 1, other=0.0)
        return lo, hi

    @triton.jit
    def _act_scales(SArow, kb0, U: tl.constexpr):
        """Activation scales of the loop step's K blocks kb0 .. kb0+U-1 per column 4u + g, times 2^8 (below)."""
        n = tl.arange(0, 16)
        return tl.load(SArow + kb0 + n // 4, mask=n < 4 * U, other=0.0) * 256.0

    @triton.jit
    def _scale_acc(acc, part, Sbytes, sa, kb0, U: tl.constexpr, G: tl.constexpr, NC: tl.constexpr,
                   WORDS: tl.constexpr = False):
        """acc += part * group scale * activation scale sa (`_act_scales`), per column 4u + g (group g of K
        block kb0 + u): the group's E8M0 byte b gives 2^(b - 127 + 6) as in `moe._group_scale` (valid for
        every byte the layout admits), the remaining 2^8 of the 2^-14 weight shift rides on the activation
        scale (all powers of two: the same products as (part * 2^(b - 127 + 14)) * sa). G > 1 pairs per
        program (NC columns, dsv4.kernels.moe_gemv_pairs): column 4Uj + 4u + g. WORDS: the row's 4U bytes
        read as U 32-bit words ([BN, 1] each: one load per row a thread holds) and split by shifts, instead of
        one byte load per accumulator element (`moe_gemv.SCALE_WORDS`)."""
        n = tl.arange(0, NC)
        if G > 1:
            n = n % (4 * U)
        if WORDS:  # (the bytes kb0 * 4 .. are 4-byte aligned: rows of D / 32 bytes, a multiple of 4)
            words = (Sbytes + kb0 * 4).to(tl.pointer_type(tl.int32))
            b = tl.zeros(part.shape, dtype=tl.int32)
            for u in tl.static_range(U):  # little-endian: byte j of word u is column 4u + j
                w = tl.load(words + u)
                b = tl.where((n // 4 == u)[None, :], (w >> (8 * (n % 4))[None, :]) & 0xFF, b)
        else:
            b = tl.load(Sbytes + kb0 * 4 + n[None, :], mask=(n < 4 * U)[None, :], other=0).to(tl.int32)
        f = ((b + 6) << 23).to(tl.float32, bitcast=True)
        return acc + (part * f) * sa[None, :]

    @triton.jit
    def _act_pos(e):
        """Stored position of element e (0..127) of a 128-block of MMA activations: the low-nibble tile's
        elements (groups 0, 2) at 0..63, the high one's (groups 1, 3) at 64..127, each in the K order of
        `_mma_order` (byte 32h + 8t + 2c + i at 16c + 8h + 2t + i)."""
        tile = (e // 32) % 2
        h = e // 64
        t = (e // 8) % 4
        c = (e // 2) % 4
        return 64 * tile + 16 * c + 8 * h + 2 * t + e % 2

    @triton.jit
    def _glu_out(gate, up, p, pid_n, offs_n, TOPK_W, Z, ZS, limit, stride_z, stride_zs,
                 BN: tl.constexpr, QUANT_OUT: tl.constexpr):
        """The decode GLU epilogue for pair p's BN channels (tile pid_n): bf16 gate / up, SwiGLU clamp, routing
        weight, and z stored as bf16 at offs_n or (QUANT_OUT, BN 128: one block) as W2's FP8 input in
        `quant16_block`'s layout (`moe_gemv`'s GLU, `moe_glu_decode`'s finish)."""
        g = tl.minimum(gate.to(tl.bfloat16).to(tl.float32), limit)
        u = tl.clamp(up.to(tl.bfloat16).to(tl.float32), -limit, limit)
        z = ((g / (1.0 + tl.exp(-g)) * u) * tl.load(TOPK_W + p)).to(tl.bfloat16)
        if QUANT_OUT:
            q, s = _quant_rows(z.to(tl.float32)[None, :])
            tl.store(Z + p * stride_z + pid_n * BN + _act_pos(tl.arange(0, BN))[None, :], q.to(tl.float16))
            tl.store(ZS + p * stride_zs + pid_n + tl.arange(0, 1), s)
        else:
            tl.store(Z + p * stride_z + offs_n, z)

    @triton.jit
    def quant16_block(x_row, q_row, s_row, kb):
        """Block kb of one row: `act_quant`'s FP8 quantisation of x_row[128 kb, +128), stored at q_row as the f16
        values of the e4m3 codes (exact) in the order of `_act_pos`, its fp32 scale at s_row[kb] (`moe_gemv`'s
        x quantisation launch, and the router's with `router.gate_route(x_quant=)`)."""
        offs = tl.arange(0, 128)
        q, s = _quant_rows(tl.load(x_row + kb * 128 + offs)[None, :].to(tl.float32))
        tl.store(q_row + kb * 128 + _act_pos(offs)[None, :], q.to(tl.float16))
        tl.store(s_row + kb + tl.arange(0, 1), s)


def check_x_quant(who: str, x_quant: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor):
    """x_quant = (xq, sx) as `quant16_block` fills them for x [T, D] (f16 [T, D], fp32 [T, D/128], contiguous rows,
    x's device, D a multiple of 128), else a ValueError naming `who`."""
    (t, d), (xq, sx) = x.shape, x_quant
    if d % BLOCK or xq.shape != (t, d) or xq.dtype != torch.float16 or sx.shape != (t, d // BLOCK) \
            or sx.dtype != torch.float32 or xq.stride(1) != 1 or sx.stride(1) != 1 \
            or xq.device != x.device or sx.device != x.device:
        raise ValueError(f"{who}: x_quant must be f16 [{t}, {d}] and fp32 [{t}, {d // BLOCK}] with contiguous rows on "
                         f"{x.device} (D a multiple of {BLOCK}), got {xq.dtype} {tuple(xq.shape)} on {xq.device}, "
                         f"{sx.dtype} {tuple(sx.shape)} on {sx.device}")
    return xq, sx
