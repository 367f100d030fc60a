"""The exact re-encode of MXFP4 expert weights to e4m3 (dsv4.kernels.moe_glu_fp8's FP8 MoE GEMMs).

A weight is e2m1(code) * 2^(b_g - 127) with b_g its 32-group's E8M0 byte. Relative to the largest byte bmax of
its tile it is e4m3(e2m1(code) * 2^(6 - d_g)) * 2^(bmax - 133) with d_g = bmax - b_g: exact while d_g <=
FP8_MAX_SCALE_SPREAD and bmax >= FP8_MIN_BLOCK_SCALE (dsv4.kernels.moe_layout.fp8_tiles checks both). The e4m3
bytes come from a prmt lookup in a table of the eight magnitudes, less d per exponent field; tests/
test_fp8_reencode_table.py checks the table and the PTX on every byte value on the CPU.

Session 11's `moe_wide_fp8` (per-row 128-wide blocks, 64-token tiles) introduced it; that kernel was 1.5-2x slower
than the bf16 MMA path and was removed in session 36 (docs/benchmarks.md, session 11).
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

# e4m3 bytes of the e2m1 magnitudes 0, .5, 1, 1.5 (low word) and 2, 3, 4, 6 (high word) times 2^6: the prmt
# table of a group at its block's largest scale; a group 2^-d below it takes d off every nonzero byte's
# exponent field (exact for d <= FP8_MAX_SCALE_SPREAD: the smallest, 0.5 * 2^6 * 2^-11 = 2^-6, stays normal)
T8_LO = 0x6C686000
T8_HI = 0x7C787470


def e4m3_pair_asm() -> str:
    """PTX for 4 packed bytes ($2) -> the e4m3 bytes of their 4 low nibbles ($0) and of their 4 high nibbles ($1)
    (`_e2m1_e4m3`). The two groups' prmt tables come precomputed per row (T8 less d per exponent field): low
    nibbles $3 / $7, high nibbles $11 / $15 (each int32 operand is 4 copies of one value, so operand 4i+3 is
    the i-th table word). Per nibble set: the 4 magnitudes gathered into one 16-bit prmt selector (and, shift,
    or, prmt), the lookup, the sign bits moved to bit 7. SASS of the GLU loop: ~1.7 instructions per weight
    (the session-10 form, one nibble set per call: ~2.1)."""
    lookup = ("and.b32 m, m, 0x07070707; shr.b32 t, m, 4; or.b32 m, m, t; prmt.b32 m, m, 0, 0x20; "
              "prmt.b32 r, {lo}, {hi}, m; ")
    return ("{ .reg .b32 m, t, r; mov.b32 m, $2; " + lookup.format(lo="$3", hi="$7") +
            "shl.b32 t, $2, 4; and.b32 t, t, 0x80808080; or.b32 $0, r, t; "
            "shr.b32 m, $2, 4; " + lookup.format(lo="$11", hi="$15") +
            "and.b32 t, $2, 0x80808080; or.b32 $1, r, t; }")


if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    _ASM8_PAIR: gl.constexpr = gl.constexpr(e4m3_pair_asm())
    _T8_LO: gl.constexpr = gl.constexpr(T8_LO)
    _T8_HI: gl.constexpr = gl.constexpr(T8_HI)

    @gluon.jit
    def _e2m1_e4m3(b, d_lo, d_hi):
        """uint8 [BN, 32] packed bytes -> (e4m3 e2m1(code) * 2^(6 - d_lo) of their low nibbles, the same of their
        high nibbles with d_hi); d_lo, d_hi [BN] int32 in 0..11 per row, turned into each row's tables here."""
        zero = b.to(gl.int32) * 0
        tla = zero + (_T8_LO - d_lo * 0x08080800)[:, None]  # (byte 0, code 0, stays 0)
        tha = zero + (_T8_HI - d_lo * 0x08080808)[:, None]
        tlb = zero + (_T8_LO - d_hi * 0x08080800)[:, None]
        thb = zero + (_T8_HI - d_hi * 0x08080808)[:, None]
        return gl.inline_asm_elementwise(_ASM8_PAIR, "=r,=r" + ",r" * 17, [b, tla, tha, tlb, thb],
                                         dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True, pack=4)
