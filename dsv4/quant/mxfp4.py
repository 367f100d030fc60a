"""MXFP4 (e2m1 values, one E8M0 scale per 32 inputs): codes, packing, weights, FP4 simulation and
the MXFP4 -> FP8-block re-encode (checkpoint_format.md §6, §8, §9; deepseek_v4_model.md §2.6).

e2m1 code = sign bit (bit 3) + magnitude code 0..7 for 0, 0.5, 1, 1.5, 2, 3, 4, 6. Encoding clamps
to ±6 and rounds to nearest, ties to even, using the spec's decision table directly (so every
midpoint is decided by one explicit `<` or `<=`). The sign is always kept: tiny negatives and -0.0
encode to code 8 (-0), like an IEEE conversion.
"""

from __future__ import annotations

import functools

import torch

from dsv4.quant.e8m0 import e8m0_bytes, e8m0_to_float, float_to_e8m0, pow2_ceil

E2M1_MAX = 6.0
MXFP4_GROUP = 32
FP8_TILE = 128
INV_E2M1_MAX = torch.tensor(1.0 / 6.0, dtype=torch.float32)  # fp32(1/6), multiplied
AMAX_FLOOR_FP4 = 6.0 * 2.0**-126  # keeps the scale >= 2^-126, a normal fp32
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float32,
)
# Magnitude v rounds up past each threshold; "strict" thresholds send their tie down (to the even
# code below), the others send it up (the even code above): table of checkpoint_format.md §8.
_TIES_DOWN = (0.25, 1.25, 2.5, 5.0)  # v >  t  -> next code
_TIES_UP = (0.75, 1.75, 3.5)  # v >= t  -> next code



@functools.lru_cache(maxsize=None)
def _e2m1_values(device: torch.device) -> torch.Tensor:
    """E2M1_VALUES on `device`, copied once (no host copy per call: CUDA-graph capturable)."""
    return E2M1_VALUES.to(device)

def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """RNE e2m1 codes (uint8) of x after clamping to ±6; comparisons in fp32 (fp64 for fp64 input)."""
    v = x if x.dtype == torch.float64 else x.to(torch.float32)
    mag = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for t in _TIES_DOWN:
        code += mag > t
    for t in _TIES_UP:
        code += mag >= t
    return code | (torch.signbit(v).to(torch.uint8) << 3)


def e2m1_encode(x: torch.Tensor, name: str = "tensor") -> torch.Tensor:
    """Round to e2m1 codes (uint8 0..15): clamp to ±6, nearest, ties to even; sign kept (-0 -> 8)."""
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if bool(torch.isnan(x).any()):
        raise ValueError(f"{name}: contains NaN, which e2m1 cannot represent")
    return _e2m1_codes(x)


def _check_codes(codes: torch.Tensor, name: str) -> None:
    if codes.dtype != torch.uint8:
        raise ValueError(f"{name}: expected uint8 e2m1 codes, got {codes.dtype}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"{name}: e2m1 code {int(codes.max())} out of range 0..15")


def e2m1_decode(codes: torch.Tensor, name: str = "codes") -> torch.Tensor:
    """e2m1 codes (uint8 0..15) -> float32 values (code 8 is -0.0)."""
    _check_codes(codes, name)
    return _e2m1_values(codes.device)[codes.long()]


def pack_e2m1(codes: torch.Tensor, name: str = "codes", check: bool = True) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] int8 bytes; low nibble = element 2j, high nibble = element 2j+1.
    check=False: codes known to be 0..15 (made by this module), nothing read back from the device."""
    if check:
        _check_codes(codes, name)
    elif codes.dtype != torch.uint8:
        raise ValueError(f"{name}: expected uint8 e2m1 codes, got {codes.dtype}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"{name}: last dim of shape {tuple(codes.shape)} must be even to pack")
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed.view(torch.int8)


def unpack_e2m1(packed: torch.Tensor, name: str = "weight") -> torch.Tensor:
    """[..., K/2] int8 (or uint8) bytes -> [..., K] uint8 codes (inverse of pack_e2m1)."""
    if packed.dtype not in (torch.int8, torch.uint8):
        raise ValueError(f"{name}: expected int8 packed e2m1 bytes, got {packed.dtype}")
    if packed.dim() == 0:
        raise ValueError(f"{name}: packed e2m1 tensor must have at least one dim")
    b = packed.view(torch.uint8)
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)


def _group_scales(amax: torch.Tensor) -> torch.Tensor:
    """fp32 power-of-two scales: fp32 amax (floored) times fp32(1/6), rounded up by pow2_ceil."""
    return pow2_ceil(amax.to(torch.float32).clamp_min(AMAX_FLOOR_FP4) * INV_E2M1_MAX)


def _groups(x: torch.Tensor, block: int, what: str) -> torch.Tensor:
    if x.dim() == 0 or x.shape[-1] % block != 0:
        raise ValueError(
            f"{what}: last dim of shape {tuple(x.shape)} must be a multiple of block={block}"
        )
    work = torch.float64 if x.dtype == torch.float64 else torch.float32  # fp64: no double rounding
    return x.to(work).reshape(*x.shape[:-1], x.shape[-1] // block, block)


def quantize_mxfp4(w: torch.Tensor, name: str = "weight", validate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., N, K] weight -> (packed int8 [..., N, K/2], scale float8_e8m0fnu [..., N, K/32]).

    validate=False (the FP4 indexer-key cache, every decode step): no finiteness check and the scale
    bytes taken straight from the fp32 exponent (the scales are normal powers of two by construction),
    so nothing is read back from the device."""
    if not w.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point weight, got {w.dtype}")
    if validate and not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name}: weight contains NaN or inf; cannot quantise to MXFP4")
    g = _groups(w.detach(), MXFP4_GROUP, name)
    s = _group_scales(g.abs().amax(dim=-1))
    codes = _e2m1_codes((g / s.unsqueeze(-1)).reshape(w.shape))
    if validate:
        scale = float_to_e8m0(s, name=f"{name} scale")
    else:
        scale = ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8).view(torch.float8_e8m0fnu)
    return pack_e2m1(codes, name, check=validate), scale


def dequantize_mxfp4(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32, name: str = "weight"
) -> torch.Tensor:
    """`W[n, k] = e2m1(code[n, k]) * 2^(scale[n, k // 32] - 127)`, exact in fp32 and bf16
    (only scale bytes >= 253 can push a value past the fp32 range, giving ±inf)."""
    codes = unpack_e2m1(packed, name)
    k = codes.shape[-1]
    if tuple(scale.shape) != (*codes.shape[:-1], k // MXFP4_GROUP) or k % MXFP4_GROUP:
        raise ValueError(
            f"{name}: scale shape {tuple(scale.shape)} does not match packed weight "
            f"{tuple(packed.shape)} (expected {(*codes.shape[:-1], k // MXFP4_GROUP)})"
        )
    s = e8m0_to_float(scale, name=f"{name} scale")
    values = _e2m1_values(codes.device)[codes.long()]
    w = values.view(*codes.shape[:-1], k // MXFP4_GROUP, MXFP4_GROUP) * s.unsqueeze(-1)
    return w.reshape(codes.shape).to(dtype)


def fake_quant_fp4(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP4 simulation: per `block` channels, s = pow2_ceil(max(amax, 6*2^-126) * fp32(1/6)),
    e2m1-round x/s and return the dequantised values in x's dtype (NaN propagates via s)."""
    g = _groups(x, block, "fake_quant_fp4")
    s = _group_scales(g.abs().amax(dim=-1)).unsqueeze(-1)
    values = _e2m1_values(x.device)[_e2m1_codes(g / s).long()]
    return (values * s).reshape(x.shape).to(x.dtype)


def _pow2_int(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for int32 e in [-126, 127] (built from the exponent bits, exact)."""
    return ((e + 127) << 23).view(torch.float32)


def mxfp4_to_fp8_block(
    packed: torch.Tensor, scale: torch.Tensor, name: str = "weight"
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Re-encode a [N, K] MXFP4 weight as FP8 e4m3fn with 128x128 E8M0 tile scales.

    Per tile: b_max = max group exponent byte, tile scale byte b' = max(b_max - 6, 0) and each
    element becomes e2m1 * 2^(b - b'), rounded to nearest-even e4m3 (exact unless b < b' - 8).
    Returns (wq [N, K], scale float8_e8m0fnu [ceil(N/128), ceil(K/128)], bad_tiles): bad_tiles
    counts tiles with a group exponent more than 14 below the tile max (b' >= 0 clamp aside),
    whose small values lose precision. Expected 0 for released checkpoints.
    """
    if packed.dim() != 2:
        raise ValueError(f"{name}: expected a 2-D packed weight, got shape {tuple(packed.shape)}")
    codes = unpack_e2m1(packed, name)
    n, k = codes.shape
    groups = k // MXFP4_GROUP
    if k % MXFP4_GROUP or tuple(scale.shape) != (n, groups):
        raise ValueError(
            f"{name}: scale shape {tuple(scale.shape)} does not match packed weight "
            f"{tuple(packed.shape)} (expected {(n, groups)})"
        )
    b = e8m0_bytes(scale, f"{name} scale").to(torch.int32)
    if bool((b == 255).any()):
        raise ValueError(f"{name} scale: contains the E8M0 NaN byte 255")

    # Tile statistics over the group-exponent grid: a 128x128 tile is 128 rows x 4 groups.
    per_tile = FP8_TILE // MXFP4_GROUP
    pad_n, pad_g = (-n) % FP8_TILE, (-groups) % per_tile
    nb, gb = (n + pad_n) // FP8_TILE, (groups + pad_g) // per_tile
    b_hi = torch.nn.functional.pad(b, (0, pad_g, 0, pad_n), value=-1)
    b_lo = torch.nn.functional.pad(b, (0, pad_g, 0, pad_n), value=256)
    b_max = b_hi.view(nb, FP8_TILE, gb, per_tile).amax(dim=(1, 3))
    b_min = b_lo.view(nb, FP8_TILE, gb, per_tile).amin(dim=(1, 3))
    tile_byte = (b_max - 6).clamp_min(0)
    bad_tiles = int((b_min < tile_byte - 8).sum())

    # Per-group shift b - b' <= 6; below -126 the product is < 2^-123, which e4m3 rounds to ±0
    # either way, so clamping the shift keeps the result identical while staying in fp32 range.
    tile_byte_per_group = tile_byte.repeat_interleave(FP8_TILE, 0).repeat_interleave(per_tile, 1)
    shift = (b - tile_byte_per_group[:n, :groups]).clamp_min(-126)
    values = _e2m1_values(codes.device)[codes.long()].view(n, groups, MXFP4_GROUP)
    scaled = values * _pow2_int(shift).unsqueeze(-1)
    wq = scaled.reshape(n, k).to(torch.float8_e4m3fn)  # |scaled| <= 6 * 2^6 = 384: no clamp needed
    return wq, tile_byte.to(torch.uint8).view(torch.float8_e8m0fnu), bad_tiles
