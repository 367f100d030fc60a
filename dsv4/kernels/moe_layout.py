"""Routed-expert weight layouts of the fused MoE kernel (dsv4.kernels.moe).

`ExpertWeights` is the checkpoint layout stacked over experts; `finalize_experts` turns it once after
loading into `PackedExperts`: w1/w3 fused into w13; MXFP4 nibbles repacked so that each 32-byte chunk
holds two whole 32-wide K groups (low nibbles one group, high nibbles the next) and group scales
packed 4 per int32 word; FP8 block scales as float32. `check_packed` guards the kernel against a
layout mix-up (which would read out of bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

BLOCK = 128
GROUP = 32
MAX_FP4_SCALE_BYTE = 248  # the kernel builds 2^(b - 121) from fp32 exponent bits
WIDE_MAX_SCALE_BYTE = 128  # dsv4.kernels.moe_wide builds 2^(b - 1) from fp32 exponent bits
FP8_MAX_SCALE_SPREAD = 11  # the e4m3 re-encode (e4m3_reencode): a group's scale byte <= 11 below its tile's largest
FP8_MIN_BLOCK_SCALE = 7  # ... and the tile scale 2^(bmax - 133) an fp32 normal


@dataclass
class ExpertWeights:
    """Routed experts in checkpoint layout, stacked over E experts.

    mxfp4: w1/w3 int8 [E, I, D/2], w1_scale/w3_scale E8M0 [E, I, D/32], w2 int8 [E, D, I/2], w2_scale [E, D, I/32].
    fp8:   w1/w3 e4m3 [E, I, D], scales float32 (or E8M0) [E, I/128, D/128], w2 [E, D, I], w2_scale [E, D/128, I/128].
    """

    fmt: str
    w1: torch.Tensor
    w1_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w3: torch.Tensor
    w3_scale: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    @property
    def inter(self) -> int:
        return self.w1.shape[1]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]


@dataclass
class PackedExperts:
    """Kernel layout made by `finalize_experts` (see the module docstring)."""

    fmt: str
    num_experts: int
    hidden: int
    inter: int
    w13: torch.Tensor  # mxfp4: uint8 [E, 2I, D/2] repacked; fp8: e4m3 [E, 2I, D]
    w13_scale: torch.Tensor  # mxfp4: int32 [E, 2I, D/128] (4 E8M0 bytes); fp8: fp32 [E, 2I/128, D/128]
    w2: torch.Tensor  # mxfp4: uint8 [E, D, I/2] repacked; fp8: e4m3 [E, D, I]
    w2_scale: torch.Tensor  # mxfp4: int32 [E, D, I/128]; fp8: fp32 [E, D/128, I/128]
    wide_ok: bool = False  # mxfp4 with every scale byte <= WIDE_MAX_SCALE_BYTE: dsv4.kernels.moe_wide applies
    # mxfp4: int32 [E, 2I/64, D/128], the largest scale byte of each 64-row x 128-wide w13 tile (moe_glu_fp8; a
    # word each, so that the kernel's cp.async ring can bring it with the block)
    w13_tile_bmax: torch.Tensor | None = None
    fp8_tiles_ok: bool = False  # ... and every group scale of a tile within FP8_MAX_SCALE_SPREAD of it (`fp8_tiles`)
    w2_tile_bmax: torch.Tensor | None = None  # the same for w2: int32 [E, D/64, I/128]
    fp8_w2_tiles_ok: bool = False
    # TMA descriptors of the kernels that stream these tensors, made on first use (dsv4.kernels.moe_glu_decode)
    tma: dict = field(default_factory=dict, repr=False, compare=False)


def repack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint nibble order (byte j = elements 2j, 2j+1) -> kernel order (per 64 elements,
    byte j = elements j and j+32, i.e. two whole 32-wide groups)."""
    b = packed.view(torch.uint8)
    k = b.shape[-1] * 2
    el = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*b.shape[:-1], k // 64, 2, 32)
    return (el[..., 0, :] | (el[..., 1, :] << 4)).reshape(b.shape)


def _fp4_scale_bytes(s: torch.Tensor, name: str) -> torch.Tensor:
    if s.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise ValueError(f"{name}: expected E8M0 (float8_e8m0fnu or uint8) scales, got {s.dtype}")
    b = s.view(torch.uint8)
    if bool((b > MAX_FP4_SCALE_BYTE).any()):
        raise ValueError(f"{name}: scale byte > {MAX_FP4_SCALE_BYTE} (>= 2^122 or NaN) is not supported")
    return b


def _pack_group_scales(b: torch.Tensor) -> torch.Tensor:
    """uint8 [E, N, K/32] -> int32 [E, N, K/128]: the 4 group scales of one 128-wide K block in one
    word (byte g = group g), so a program loads all its scales as one small [BN, K/128] tile."""
    e, n, g = b.shape
    return b.contiguous().view(torch.int32).view(e, n, g // 4)


def fp8_tiles(b: torch.Tensor, rows: int = 64) -> tuple[torch.Tensor, bool]:
    """E8M0 group scales b uint8 [E, N, K/32] -> (the largest byte of each rows x 128-wide tile, int32 [E, N/rows,
    K/128]; whether every tile re-encodes exactly to e4m3 relative to it, dsv4.kernels.moe_glu_fp8: its bytes
    within FP8_MAX_SCALE_SPREAD of the largest, which is >= FP8_MIN_BLOCK_SCALE)."""
    e, n, g = b.shape
    t = b.reshape(e, n // rows, rows, g // 4, 4)
    hi, lo = t.amax((2, 4)), t.amin((2, 4))
    ok = bool(((hi - lo <= FP8_MAX_SCALE_SPREAD) & (hi >= FP8_MIN_BLOCK_SCALE)).all())
    return hi.to(torch.int32).contiguous(), ok


def finalize_experts(w: ExpertWeights) -> PackedExperts:
    """Build the kernel layout once after load; the caller may drop `w` afterwards."""
    e, i, h = w.num_experts, w.inter, w.hidden
    if w.fmt == "mxfp4":
        if w.w1.shape != (e, i, h // 2) or w.w3.shape != w.w1.shape or w.w2.shape != (e, h, i // 2):
            raise ValueError(f"experts: inconsistent MXFP4 shapes w1 {tuple(w.w1.shape)}, w3 {tuple(w.w3.shape)}, "
                             f"w2 {tuple(w.w2.shape)}")
        if h % BLOCK or i % BLOCK:
            raise ValueError(f"experts: hidden {h} and inter {i} must be multiples of 128")
        w13 = torch.empty((e, 2 * i, h // 2), dtype=torch.uint8, device=w.w1.device)
        w2 = torch.empty((e, h, i // 2), dtype=torch.uint8, device=w.w1.device)
        for x in range(e):  # one expert at a time keeps the unpacked temporary small
            w13[x, :i] = repack_fp4(w.w1[x])
            w13[x, i:] = repack_fp4(w.w3[x])
            w2[x] = repack_fp4(w.w2[x])
        s13 = torch.cat([_fp4_scale_bytes(w.w1_scale, "w1_scale"), _fp4_scale_bytes(w.w3_scale, "w3_scale")], 1)
        s2 = _fp4_scale_bytes(w.w2_scale, "w2_scale")
        if s13.shape != (e, 2 * i, h // GROUP) or s2.shape != (e, h, i // GROUP):
            raise ValueError(f"experts: MXFP4 scale shapes {tuple(s13.shape)} / {tuple(s2.shape)} do not match")
        wide_ok = int(s13.max()) <= WIDE_MAX_SCALE_BYTE and int(s2.max()) <= WIDE_MAX_SCALE_BYTE
        tile_bmax, tiles_ok = fp8_tiles(s13)
        tile_bmax2, tiles_ok2 = fp8_tiles(s2)
        return PackedExperts("mxfp4", e, h, i, w13, _pack_group_scales(s13), w2, _pack_group_scales(s2), wide_ok,
                             tile_bmax, tiles_ok, tile_bmax2, tiles_ok2)
    if w.fmt == "fp8":
        from dsv4.kernels.fp8_linear import _weight_scale_f32

        if w.w1.dtype != torch.float8_e4m3fn or w.w1.shape != (e, i, h) or w.w2.shape != (e, h, i):
            raise ValueError(f"experts: inconsistent FP8 shapes w1 {tuple(w.w1.shape)}, w2 {tuple(w.w2.shape)}")
        s13 = torch.cat([_weight_scale_f32(w.w1_scale, "w1_scale"), _weight_scale_f32(w.w3_scale, "w3_scale")], 1)
        s2 = _weight_scale_f32(w.w2_scale, "w2_scale")
        if s13.shape != (e, 2 * i // BLOCK, h // BLOCK) or s2.shape != (e, h // BLOCK, i // BLOCK):
            raise ValueError(f"experts: FP8 scale shapes {tuple(s13.shape)} / {tuple(s2.shape)} do not match")
        return PackedExperts("fp8", e, h, i, torch.cat([w.w1, w.w3], 1).contiguous(), s13.contiguous(),
                             w.w2.contiguous(), s2.contiguous())
    raise ValueError(f"experts: unknown format {w.fmt!r}")


def check_packed(p: PackedExperts) -> None:
    """Shapes and dtypes of the kernel layout (a layout mix-up would otherwise read out of bounds)."""
    e, d, i = p.num_experts, p.hidden, p.inter
    if p.fmt == "mxfp4":
        want = {"w13": ((e, 2 * i, d // 2), torch.uint8), "w13_scale": ((e, 2 * i, d // BLOCK), torch.int32),
                "w2": ((e, d, i // 2), torch.uint8), "w2_scale": ((e, d, i // BLOCK), torch.int32)}
    else:
        want = {"w13": ((e, 2 * i, d), torch.float8_e4m3fn),
                "w13_scale": ((e, 2 * i // BLOCK, d // BLOCK), torch.float32),
                "w2": ((e, d, i), torch.float8_e4m3fn), "w2_scale": ((e, d // BLOCK, i // BLOCK), torch.float32)}
    for name, (shape, dtype) in want.items():
        t = getattr(p, name)
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"PackedExperts.{name}: expected contiguous {dtype} {shape} (see finalize_experts), "
                             f"got {t.dtype} {tuple(t.shape)}")
