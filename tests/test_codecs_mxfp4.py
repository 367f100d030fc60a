"""e2m1 / MXFP4 codecs and the MXFP4 -> FP8-block re-encode against independent float64 references.

Grids are decoded from the bit layouts, rounding is "nearest grid point, exact midpoint -> even
code", and the spec's decision table (checkpoint_format.md §8) is checked value by value.
"""

import math

import pytest
import torch

from dsv4.quant.fp8 import dequantize_fp8_block
from dsv4.quant.mxfp4 import (
    dequantize_mxfp4,
    e2m1_decode,
    e2m1_encode,
    fake_quant_fp4,
    mxfp4_to_fp8_block,
    pack_e2m1,
    quantize_mxfp4,
    unpack_e2m1,
)

F32_INV_6 = float(torch.tensor(1 / 6, dtype=torch.float32))
FP4_FLOOR = 6 * 2.0**-126


# ---------------------------------------------------------------- float64 references


def ref_e2m1_value(code: int) -> float:
    """bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; exponent 0 is subnormal (0 or 0.5)."""
    sign = -1.0 if code & 8 else 1.0
    e, m = (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return sign * mag


E2M1_TABLE = torch.tensor([ref_e2m1_value(c) for c in range(16)], dtype=torch.float64)
E2M1_POS_GRID = E2M1_TABLE[:8]


def ref_e4m3_value(code: int) -> float:
    if code & 0x7F == 0x7F:
        return math.nan
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    return sign * ((m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


E4M3_TABLE = torch.tensor([ref_e4m3_value(c) for c in range(256)], dtype=torch.float64)


def ref_round_to_grid(v: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Magnitude code of |v| (float64, within the grid) : nearest point, exact midpoint -> even code."""
    a = v.abs()
    hi = torch.searchsorted(grid, a).clamp(max=len(grid) - 1)
    lo = (hi - 1).clamp(min=0)
    mid = (grid[lo] + grid[hi]) / 2
    code = torch.where(a < mid, lo, hi)
    code = torch.where((a == mid) & (lo != hi), torch.where(lo % 2 == 0, lo, hi), code)
    return torch.where(grid[hi] == a, hi, code)


def ref_e2m1_rne(v: torch.Tensor) -> torch.Tensor:
    """float64 -> e2m1 code: clamp to ±6, nearest-even, sign kept (tiny negatives -> 8)."""
    code = ref_round_to_grid(v.clamp(-6, 6), E2M1_POS_GRID)
    return (code | (torch.signbit(v).long() << 3)).to(torch.uint8)


def ref_e4m3_rne(v: torch.Tensor) -> torch.Tensor:
    assert bool((v.abs() <= 448).all())
    code = ref_round_to_grid(v, E4M3_TABLE[:127])
    return (code | (torch.signbit(v).long() << 7)).to(torch.uint8)


def ref_pow2_ceil(a: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= a for normal fp32 a > 0 (all the FP4 floor leaves)."""
    assert bool((a >= 2.0**-126).all())
    mant, exp = torch.frexp(a)
    return torch.where(mant == 0.5, a, torch.ldexp(torch.ones_like(a), exp.to(torch.float64)))


def ref_fp4_scales(amax: torch.Tensor) -> torch.Tensor:
    floored = torch.clamp(amax.to(torch.float32).to(torch.float64), min=FP4_FLOOR)
    return ref_pow2_ceil(floored.mul(F32_INV_6).to(torch.float32).to(torch.float64))


def all_bf16() -> torch.Tensor:
    v = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return v.to(torch.float64)


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


# ---------------------------------------------------------------- e2m1 codes


def test_every_code_decodes_to_the_bit_layout_value():
    codes = torch.arange(16, dtype=torch.uint8)
    got = e2m1_decode(codes)
    assert got.dtype == torch.float32
    assert torch.equal(got.to(torch.float64), E2M1_TABLE)
    assert torch.equal(torch.signbit(got), codes >= 8)  # code 8 is -0.0
    spec_row = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]  # checkpoint_format §6
    assert got.tolist() == spec_row


# Spec decision table, §8: every midpoint, each side of it, and the ±6 clamp.
SPEC_CASES = [
    (0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
    (0.0, 0.0), (0.1, 0.0), (0.3, 0.5), (0.74, 0.5), (1.3, 1.5), (1.7, 1.5), (2.6, 3.0), (3.4, 3.0),
    (5.1, 6.0), (6.0, 6.0), (100.0, 6.0), (math.inf, 6.0),
]


@pytest.mark.parametrize("v,expected", SPEC_CASES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_decision_table_including_every_midpoint(v, expected, sign, dtype):
    code = e2m1_encode(torch.tensor([sign * v], dtype=dtype))
    assert code.dtype == torch.uint8
    value = e2m1_decode(code).item()
    assert value == sign * expected
    assert (int(code) >= 8) == (sign < 0)  # sign always kept, so -0.1 and -0.0 give code 8


def test_fp32_neighbours_of_every_midpoint():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    lo_side, hi_side = torch.nextafter(mids, torch.zeros_like(mids)), torch.nextafter(mids, mids * 2)
    grid = E2M1_POS_GRID.to(torch.float32)
    below = grid[torch.searchsorted(grid, mids) - 1]
    above = grid[torch.searchsorted(grid, mids)]
    for sign in (1.0, -1.0):
        assert torch.equal(e2m1_decode(e2m1_encode(sign * lo_side)), sign * below)
        assert torch.equal(e2m1_decode(e2m1_encode(sign * hi_side)), sign * above)


def test_every_bf16_pattern_matches_float64_nearest_even():
    v = all_bf16()
    finite = ~torch.isnan(v)
    got = e2m1_encode(v[finite].to(torch.bfloat16))
    assert torch.equal(got, ref_e2m1_rne(v[finite]))
    with pytest.raises(ValueError, match="indexer.q.*NaN"):
        e2m1_encode(v.to(torch.bfloat16), name="indexer.q")


def test_pack_unpack_nibble_order_and_round_trip():
    gen = torch.Generator().manual_seed(10)
    codes = torch.randint(0, 16, (3, 5, 64), generator=gen).to(torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.dtype == torch.int8 and packed.shape == (3, 5, 32)
    as_int = packed.view(torch.uint8).long()
    assert torch.equal(as_int, codes[..., 0::2].long() + 16 * codes[..., 1::2].long())
    assert torch.equal(unpack_e2m1(packed), codes)

    every_byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    unpacked = unpack_e2m1(every_byte.view(torch.int8)).view(256, 2).long()
    assert torch.equal(unpacked[:, 0], torch.arange(256) % 16)
    assert torch.equal(unpacked[:, 1], torch.arange(256) // 16)
    assert torch.equal(pack_e2m1(unpack_e2m1(every_byte.view(torch.int8))), every_byte.view(torch.int8))


def test_worked_example_byte_0xA3():
    byte = torch.tensor([[0xA3] * 16], dtype=torch.uint8)
    assert unpack_e2m1(byte.view(torch.int8))[0, :2].tolist() == [3, 10]
    w = dequantize_mxfp4(byte.view(torch.int8), torch.tensor([[120]], dtype=torch.uint8))
    assert w[0, :2].tolist() == [1.5 * 2.0**-7, -1.0 * 2.0**-7]


def test_code_validation():
    with pytest.raises(ValueError, match="out of range"):
        e2m1_decode(torch.tensor([16], dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        pack_e2m1(torch.tensor([1, 2], dtype=torch.int64))
    with pytest.raises(ValueError, match="even"):
        pack_e2m1(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="int8"):
        unpack_e2m1(torch.zeros(4, dtype=torch.float32))


# ---------------------------------------------------------------- MXFP4 weights and FP4 simulation


def grouped_weight(n: int, k: int, seed: int) -> torch.Tensor:
    """Random bf16 weight with per-32-group magnitudes spread over 2^-30..2^10, a group below the
    FP4 floor and a group of exact e2m1 midpoints."""
    gen = torch.Generator().manual_seed(seed)
    mult = torch.ldexp(torch.ones(n, k // 32), torch.randint(-30, 10, (n, k // 32), generator=gen).float())
    w = torch.randn(n, k, generator=gen) * mult.repeat_interleave(32, 1)
    w[0, :32] = 1e-39 * torch.randn(32, generator=gen)  # amax below 6*2^-126
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    w[1, 32:64] = (mids.repeat(4) * torch.where(torch.rand(32, generator=gen) < 0.5, -1.0, 1.0)) * 2.0**-3
    return w.to(torch.bfloat16)


def test_quantize_mxfp4_matches_float64_rule():
    n, k = 48, 256
    w = grouped_weight(n, k, seed=11)
    packed, scale = quantize_mxfp4(w)
    assert packed.dtype == torch.int8 and packed.shape == (n, k // 2)
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (n, k // 32)

    g = w.to(torch.float64).view(n, k // 32, 32)
    s_ref = ref_fp4_scales(g.abs().amax(dim=-1))
    s_bytes = scale.view(torch.uint8).double() - 127
    assert torch.equal(torch.ldexp(torch.ones_like(s_bytes), s_bytes), s_ref)
    assert s_ref[1, 1] == 2.0**-3  # midpoint group: amax 6*2^-3 keeps scale 2^-3, ties decide
    codes_ref = ref_e2m1_rne(g / s_ref.unsqueeze(-1)).view(n, k)
    assert torch.equal(unpack_e2m1(packed), codes_ref)

    deq = dequantize_mxfp4(packed, scale).to(torch.float64).view(n, k // 32, 32)
    q = E2M1_TABLE[codes_ref.long()].view(n, k // 32, 32)
    assert torch.equal(deq, q * s_ref.unsqueeze(-1))
    half_step = torch.where(q.abs() < 2, 0.25, torch.where(q.abs() < 4, 0.5, 1.0))
    assert bool(((deq - g).abs() <= half_step * s_ref.unsqueeze(-1)).all())


def test_quantize_mxfp4_rejects_bad_input():
    with pytest.raises(ValueError, match="multiple of block=32"):
        quantize_mxfp4(torch.randn(4, 48))
    w = torch.randn(4, 64)
    w[2, 3] = math.inf
    with pytest.raises(ValueError, match="layers.3.ffn.experts.7.w2.weight.*NaN or inf"):
        quantize_mxfp4(w, name="layers.3.ffn.experts.7.w2.weight")


def random_mxfp4(shape: tuple[int, ...], seed: int, lo: int = 0, hi: int = 255):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, shape, generator=gen).to(torch.uint8)
    sbytes = torch.randint(lo, hi, (*shape[:-1], shape[-1] // 32), generator=gen).to(torch.uint8)
    return codes, sbytes


def ref_dequant_mxfp4(codes: torch.Tensor, sbytes: torch.Tensor) -> torch.Tensor:
    s = torch.ldexp(torch.ones(sbytes.shape, dtype=torch.float64), sbytes.double() - 127)
    return E2M1_TABLE[codes.long()] * s.repeat_interleave(32, -1)


def test_dequantize_mxfp4_random_bytes_every_scale_byte():
    codes, sbytes = random_mxfp4((2, 40, 320), seed=12)  # leading expert dim, every scale byte 0..254
    sbytes.view(-1)[:255] = torch.arange(255, dtype=torch.int32).to(torch.uint8)
    packed = pack_e2m1(codes)
    expected = ref_dequant_mxfp4(codes, sbytes)
    assert bool((expected.abs() > torch.finfo(torch.float32).max).any())  # scale bytes >= 254 overflow fp32
    for scale in (sbytes, sbytes.view(torch.float8_e8m0fnu)):
        got = dequantize_mxfp4(packed, scale)
        assert got.shape == codes.shape and got.dtype == torch.float32
        assert torch.equal(got, expected.to(torch.float32))  # exact value, rounded once (only ±inf)
        assert torch.equal(torch.signbit(got), torch.signbit(expected))
        assert torch.equal(dequantize_mxfp4(packed, scale, dtype=torch.bfloat16), expected.to(torch.bfloat16))
    with pytest.raises(ValueError, match="w1.weight: scale shape"):
        dequantize_mxfp4(packed, sbytes[..., :-1], name="w1.weight")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fake_quant_fp4_equals_float64_quantise_dequantise(dtype):
    gen = torch.Generator().manual_seed(13)
    group_exp = torch.randint(-20, 8, (3, 5, 4), generator=gen).float()
    group_mult = torch.ldexp(torch.ones(3, 5, 4), group_exp).repeat_interleave(32, -1)
    x = torch.randn(3, 5, 128, generator=gen, dtype=torch.float64) * group_mult
    x[0, 0, :32] *= 1e-38
    x[0, 1, 32:64] = 0.0  # an all-zero group: the floor keeps its scale finite (2^-126)
    x[1, 1, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0]).repeat(4)  # exact midpoints
    # amax 6 gives scale 1; in float64 a hair above a tie-down midpoint must round up (fp32 would not)
    x[2, 3, :32] = torch.tensor([6.0, 0.25 + 2.0**-40, -(2.5 + 2.0**-40), 5.0], dtype=torch.float64).repeat(8)
    x = x.to(dtype)
    got = fake_quant_fp4(x)
    assert got.dtype == dtype and got.shape == x.shape
    g = x.to(torch.float64).view(-1, 4, 32)
    s = ref_fp4_scales(g.abs().amax(dim=-1)).unsqueeze(-1)
    expected = (E2M1_TABLE[ref_e2m1_rne(g / s).long()] * s).view(x.shape)
    assert torch.equal(got.to(torch.float64), expected)
    assert got[1, 1, :8].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -6.0]
    if dtype == torch.float64:
        assert got[2, 3, :4].tolist() == [6.0, 0.5, -3.0, 4.0]
    with pytest.raises(ValueError, match="multiple of block=32"):
        fake_quant_fp4(torch.randn(2, 48))


# ---------------------------------------------------------------- MXFP4 -> FP8 block re-encode


def exact_range_scales(n: int, k: int, seed: int, spread: int = 14) -> torch.Tensor:
    """Group exponent bytes whose 128x128 tiles each span at most `spread` below the tile max."""
    gen = torch.Generator().manual_seed(seed)
    nb, kb = -(-n // 128), -(-k // 128)
    tile_max = torch.randint(spread, 255, (nb, kb), generator=gen)
    tile_max[0, 0] = 3  # tile max below 6: tile scale byte clamps to 0, still exact
    per_group = tile_max.repeat_interleave(128, 0).repeat_interleave(4, 1)[:n, : k // 32]
    below = torch.randint(0, spread + 1, (n, k // 32), generator=gen)
    return (per_group - below).clamp(min=0).to(torch.uint8)


@pytest.mark.parametrize("shape", [(256, 384), (200, 160)])
def test_reencode_is_bit_exact_within_the_exactness_range(shape):
    n, k = shape
    codes, _ = random_mxfp4(shape, seed=14)
    sbytes = exact_range_scales(n, k, seed=15)
    packed = pack_e2m1(codes)
    wq, tile_scale, bad = mxfp4_to_fp8_block(packed, sbytes.view(torch.float8_e8m0fnu))
    assert bad == 0
    assert wq.dtype == torch.float8_e4m3fn and wq.shape == (n, k)
    assert tile_scale.dtype == torch.float8_e8m0fnu and tile_scale.shape == (-(-n // 128), -(-k // 128))

    b = sbytes.long()
    padded = torch.full((tile_scale.shape[0] * 128, tile_scale.shape[1] * 4), -1, dtype=torch.long)
    padded[:n, : k // 32] = b
    b_max = padded.view(tile_scale.shape[0], 128, tile_scale.shape[1], 4).amax(dim=(1, 3))
    assert torch.equal(tile_scale.view(torch.uint8).long(), (b_max - 6).clamp(min=0))

    via_fp8 = dequantize_fp8_block(wq, tile_scale)
    via_fp4 = dequantize_mxfp4(packed, sbytes)
    assert bit_equal(via_fp8, via_fp4)
    assert torch.equal(via_fp4.to(torch.float64), ref_dequant_mxfp4(codes, sbytes))


def test_reencode_counts_and_rounds_violating_tiles():
    n, k = 256, 256
    codes, _ = random_mxfp4((n, k), seed=16)
    sbytes = exact_range_scales(n, k, seed=17, spread=10)
    sbytes[:128, :4] = 150
    sbytes[5, 2] = 150 - 15  # tile (0, 0): one group 15 below its max -> violating
    codes[5, 64:96] = torch.tensor([1, 9, 2, 3] * 8, dtype=torch.uint8)  # ±0.5·2^-9 ties to 0
    sbytes[130, 7] = sbytes[128:256, 4:8].max() - 14  # tile (1, 1): exactly 14 below, still exact
    packed = pack_e2m1(codes)
    wq, tile_scale, bad = mxfp4_to_fp8_block(packed, sbytes)
    assert bad == 1

    # Every element is still the e4m3 nearest-even rounding of the exact value on the tile scale.
    exact = ref_dequant_mxfp4(codes, sbytes)
    ts = torch.ldexp(torch.ones(2, 2, dtype=torch.float64), tile_scale.view(torch.uint8).double() - 127)
    ts_el = ts.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.equal(wq.view(torch.uint8), ref_e4m3_rne(exact / ts_el))
    via_fp8 = dequantize_fp8_block(wq, tile_scale).to(torch.float64)
    lossy = via_fp8 != exact
    assert bool(lossy.any()) and bool(lossy[5, 64:96].any())
    assert not bool(lossy[128:, 128:].any()) and not bool(lossy[:128, 128:].any())
    assert via_fp8[5, 64].item() == 0.0 and torch.signbit(via_fp8[5, 65])  # 0.5·2^-9·s rounds to ±0


def test_reencode_rejects_bad_input():
    codes, sbytes = random_mxfp4((128, 128), seed=18, lo=0, hi=200)
    packed = pack_e2m1(codes)
    with pytest.raises(ValueError, match="scale shape"):
        mxfp4_to_fp8_block(packed, sbytes[:, :2])
    sbytes[4, 1] = 255
    with pytest.raises(ValueError, match="w3.weight scale: contains the E8M0 NaN byte"):
        mxfp4_to_fp8_block(packed, sbytes, name="w3.weight")
    with pytest.raises(ValueError, match="2-D"):
        mxfp4_to_fp8_block(packed.unsqueeze(0), sbytes.unsqueeze(0))


def test_unvalidated_quantize_is_bit_identical():
    """The decode cache's fast path (no checks, scale bytes from the fp32 exponent) equals the
    validated encoder bit for bit, over 40 binades including groups at the amax floor."""
    from dsv4.quant.mxfp4 import quantize_mxfp4

    g = torch.Generator().manual_seed(9)
    x = torch.randn(64, 256, generator=g) * torch.exp2(torch.randint(-30, 10, (64, 8), generator=g).float()
                                                      ).repeat_interleave(32, 1)
    x[3, :32] = 0.0  # an all-zero group: the floored scale
    q1, s1 = quantize_mxfp4(x)
    q2, s2 = quantize_mxfp4(x, validate=False)
    assert torch.equal(q1, q2)
    assert torch.equal(s1.view(torch.uint8), s2.view(torch.uint8))
