"""E8M0 scales, pow2_ceil and FP8 e4m3 codecs against independent float64 re-derivations.

The references here never call dsv4: the e4m3 grid is decoded from its bit layout, rounding is
"nearest grid point, exact midpoint -> even mantissa", and pow2_ceil uses frexp.
"""

import math
import re

import pytest
import torch

from dsv4.quant.e8m0 import e8m0_to_float, float_to_e8m0, pow2_ceil
from dsv4.quant.fp8 import dequantize_fp8_block, fake_quant_fp8, quantize_act, quantize_fp8_block

F32_1E4 = float(torch.tensor(1e-4, dtype=torch.float32))  # fp32(1e-4), the amax floor
F32_INV_448 = float(torch.tensor(1 / 448, dtype=torch.float32))  # fp32(1/448)


# ---------------------------------------------------------------- float64 references


def ref_e4m3_value(code: int) -> float:
    """OCP e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7F/0xFF are NaN."""
    if code & 0x7F == 0x7F:
        return math.nan
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 7
    mag = (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return sign * mag


E4M3_TABLE = torch.tensor([ref_e4m3_value(c) for c in range(256)], dtype=torch.float64)
E4M3_POS_GRID = E4M3_TABLE[:127]  # codes 0x00..0x7E, ascending, 0 .. 448


def ref_round_to_grid(v: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """Magnitude code of |v| (float64) on an ascending grid: nearest point, midpoint -> even code."""
    a = v.abs()
    hi = torch.searchsorted(grid, a).clamp(max=len(grid) - 1)  # grid[hi] >= a (a within range)
    lo = (hi - 1).clamp(min=0)
    mid = (grid[lo] + grid[hi]) / 2  # exact in float64
    code = torch.where(a < mid, lo, hi)
    tie = (a == mid) & (lo != hi)
    code = torch.where(tie, torch.where(lo % 2 == 0, lo, hi), code)
    return torch.where(grid[hi] == a, hi, code)


def ref_e4m3_rne(v: torch.Tensor) -> torch.Tensor:
    """float64 values within ±448 -> e4m3fn bytes (uint8), sign kept (tiny negatives -> 0x80)."""
    assert bool((v.abs() <= 448).all())
    code = ref_round_to_grid(v, E4M3_POS_GRID)
    return (code | (torch.signbit(v).long() << 7)).to(torch.uint8)


def ref_pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= |v| for normal fp32 v; 0 -> 0, subnormal -> 2^-126, > 2^127 -> inf."""
    a = v.to(torch.float64).abs()
    mant, exp = torch.frexp(a)  # a = mant * 2^exp, mant in [0.5, 1)
    r = torch.where(mant == 0.5, a, torch.ldexp(torch.ones_like(a), exp.to(torch.float64)))
    r = torch.where(a < 2.0**-126, torch.full_like(a, 2.0**-126), r)
    r = torch.where(a == 0, torch.zeros_like(a), r)
    r = torch.where((r > 2.0**127) | torch.isinf(a), torch.full_like(a, math.inf), r)
    return torch.where(torch.isnan(a), a, r)


def pow2(exponents: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """2^e elementwise for integer exponents, exact (float64 math)."""
    return torch.ldexp(torch.ones(exponents.shape, dtype=torch.float64), exponents.double()).to(dtype)


def half_ulp_e4m3(q: torch.Tensor) -> torch.Tensor:
    """Half the e4m3 grid spacing at the float64 grid values q (subnormal spacing 2^-9)."""
    normal = pow2(torch.frexp(q.abs()).exponent - 5)  # |q| in [2^(E-1), 2^E): spacing 2^(E-4)
    return torch.where(q.abs() < 2.0**-6, 2.0**-10, normal)


def fp32_round(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).to(torch.float64)


def ref_scales(amax: torch.Tensor) -> torch.Tensor:
    """Block scale: pow2_ceil(fp32(max(fp32(amax), fp32(1e-4)) * fp32(1/448)))."""
    floored = torch.clamp(fp32_round(amax), min=F32_1E4)
    return ref_pow2_ceil(fp32_round(floored * F32_INV_448))  # float64 product of two fp32 is exact


def all_bf16() -> torch.Tensor:
    """Every finite bf16 value (as float64)."""
    v = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    v = v.to(torch.float64)
    return v[torch.isfinite(v)]


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).view(torch.int32)


# ---------------------------------------------------------------- E8M0


def test_e8m0_decodes_every_byte():
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    expected = torch.tensor([math.ldexp(1.0, b - 127) for b in range(255)] + [math.nan])
    expected = expected.to(torch.float64)
    for t in (raw, raw.view(torch.float8_e8m0fnu)):
        got = e8m0_to_float(t)
        assert got.dtype == torch.float32
        assert torch.equal(got[:255].to(torch.float64), expected[:255])
        assert math.isnan(got[255])
    assert e8m0_to_float(raw)[0] > 0  # 2^-127 is a subnormal, not flushed to zero


def test_e8m0_rejects_other_dtypes():
    with pytest.raises(ValueError, match="float8_e8m0fnu or uint8"):
        e8m0_to_float(torch.tensor([127], dtype=torch.int32))


def test_float_to_e8m0_round_trips_every_finite_byte():
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(255, generator=gen)
    values = torch.tensor([math.ldexp(1.0, int(b) - 127) for b in order], dtype=torch.float64)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        enc = float_to_e8m0(values.to(dtype).reshape(5, 51))
        assert enc.dtype == torch.float8_e8m0fnu and enc.shape == (5, 51)
        assert torch.equal(enc.view(torch.uint8).flatten().long(), order)
        assert torch.equal(e8m0_to_float(enc).flatten().to(torch.float64), values)


@pytest.mark.parametrize(
    "bad",
    [3.0, 0.0, -0.0, -2.0, math.nan, math.inf, 0.75]
    + [1.0 + 2.0**-23, 1.0 + 2.0**-40, 2.0**-128, 2.0**128],
)
def test_float_to_e8m0_names_the_offending_value(bad):
    gen = torch.Generator().manual_seed(1)
    good = pow2(torch.randint(-127, 128, (64,), generator=gen))
    idx = int(torch.randint(0, 64, (1,), generator=gen))
    good[idx] = bad
    with pytest.raises(ValueError, match=f"value {re.escape(repr(bad))} at flat index {idx}"):
        float_to_e8m0(good, name="layers.0.ffn.w1.scale")
    with pytest.raises(ValueError, match="layers.0.ffn.w1.scale"):
        float_to_e8m0(good, name="layers.0.ffn.w1.scale")


# ---------------------------------------------------------------- pow2_ceil


def pow2_ceil_cases() -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    random_bits = torch.randint(-(2**31), 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64)
    random_vals = random_bits.to(torch.int32).view(torch.float32)
    powers = torch.ldexp(torch.ones(277), torch.arange(-149, 128).float())  # subnormal powers too
    up = torch.nextafter(powers, torch.full_like(powers, math.inf))
    down = torch.nextafter(powers, torch.zeros_like(powers))
    sub = torch.randint(1, 2**23, (5000,), generator=gen).to(torch.int32).view(torch.float32)
    edges = torch.tensor(
        [0.0, -0.0, math.inf, -math.inf, math.nan, 3.4028234663852886e38, 2.0**127, 1.17549435e-38, 1e-4 / 448]
    )
    v = torch.cat([random_vals, powers, up, down, sub, edges])
    return torch.cat([v, -v])


def test_pow2_ceil_matches_float64_definition():
    v = pow2_ceil_cases()
    got = pow2_ceil(v)
    assert got.dtype == torch.float32
    ref = ref_pow2_ceil(v)
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].to(torch.float64), ref[~nan])


def test_pow2_ceil_is_smallest_power_at_or_above_for_normals():
    v = pow2_ceil_cases()
    v = v[torch.isfinite(v) & (v.abs() >= 2.0**-126) & (v.abs() <= 2.0**127)].abs().to(torch.float64)
    r = pow2_ceil(v).to(torch.float64)
    assert bool((r >= v).all()) and bool((r / 2 < v).all())
    assert bool((torch.frexp(r).mantissa == 0.5).all())


def test_pow2_ceil_bf16_input_uses_exact_value():
    v = all_bf16()
    got = pow2_ceil(v.to(torch.bfloat16))
    assert torch.equal(got.to(torch.float64), ref_pow2_ceil(v))


# ---------------------------------------------------------------- e4m3 rounding


def e4m3_neighbourhoods() -> torch.Tensor:
    """Every e4m3 grid point and midpoint (and the fp32 values just beside them), both signs."""
    g = E4M3_POS_GRID
    mids = (g[:-1] + g[1:]) / 2
    pts = torch.cat([g, mids, torch.tensor([2.0**-10 / 2, 2.0**-11, 2.0**-20])]).to(torch.float32)
    up = torch.nextafter(pts, torch.full_like(pts, math.inf))
    down = torch.nextafter(pts, torch.full_like(pts, -math.inf))
    v = torch.cat([pts, up, down]).clamp(-448, 448)
    return torch.cat([v, -v]).to(torch.float64)


def test_torch_e4m3_cast_is_rne_on_every_bf16_and_every_neighbourhood():
    bf16 = all_bf16()
    v = torch.cat([bf16[bf16.abs() <= 448], e4m3_neighbourhoods()])
    got = v.to(torch.float32).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(got, ref_e4m3_rne(v))


def test_quantize_act_rounds_clamps_and_scales_like_the_spec():
    gen = torch.Generator().manual_seed(3)
    rows, k = 24, 512
    x = torch.randn(rows, k, generator=gen, dtype=torch.float64)
    x = x * pow2(torch.randint(-20, 20, (rows, 1), generator=gen))
    x[0] *= 1e-6  # below the 1e-4 amax floor
    x[1, :128] = 448.0 * 2.0**-3 * torch.sign(x[1, :128])  # amax exactly 448*2^-3: scale 2^-3
    x[2, 5] = 1e30  # one huge value: the rest of its block underflows to (signed) zero
    x[3, :128] = DOUBLE_ROUNDING_TRAP.repeat(32)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        xd = x.to(dtype)
        q, s = quantize_act(xd.view(2, 12, k))
        assert q.dtype == torch.float8_e4m3fn and q.shape == (2, 12, k)
        assert s.dtype == torch.float32 and s.shape == (2, 12, k // 128)
        xv = xd.to(torch.float64).view(rows, k // 128, 128)
        s_ref = ref_scales(xv.abs().amax(dim=-1))
        assert torch.equal(s.view(rows, -1).to(torch.float64), s_ref)
        q_ref = ref_e4m3_rne((xv / s_ref.unsqueeze(-1)).clamp(-448, 448))
        assert torch.equal(q.view(torch.uint8).view(rows, k // 128, 128), q_ref)


# amax 448 gives scale 1; 1.0625 is the midpoint of 1 and 1.125. In float64, 1.0625 + 2^-40 must
# round up: going through fp32 first would land on the midpoint and round down to even.
DOUBLE_ROUNDING_TRAP = torch.tensor([448.0, 1.0625 + 2.0**-40, -(1.0625 + 2.0**-40), 1.0625], dtype=torch.float64)


@pytest.mark.parametrize("block", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fake_quant_fp8_equals_float64_quantise_dequantise(block, dtype):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 5, 512, generator=gen, dtype=torch.float64) * torch.rand(3, 5, 1, generator=gen) * 30
    x[0, 0] *= 1e-7
    x[0, 1, :block] = 0.0  # an all-zero block: the floor keeps its scale finite
    x[1, 2, :64] = DOUBLE_ROUNDING_TRAP.repeat(16)
    x = x.to(dtype)
    got = fake_quant_fp8(x, block)
    assert got.dtype == dtype and got.shape == x.shape
    xv = x.to(torch.float64).reshape(-1, 512 // block, block)
    s = ref_scales(xv.abs().amax(dim=-1)).unsqueeze(-1)
    q = E4M3_TABLE[ref_e4m3_rne((xv / s).clamp(-448, 448)).long()]
    expected = (q * s).reshape(x.shape)
    assert torch.equal(got.to(torch.float64), expected)  # q*s is exact in bf16: no final rounding
    if dtype == torch.float64:
        assert got[1, 2, :4].tolist() == [448.0, 1.125, -1.125, 1.0]
    # Rounding error is at most half an e4m3 ulp of the scaled value.
    assert bool(((q * s - xv).abs() <= half_ulp_e4m3(q) * s).all())


def test_activation_quant_rejects_bad_last_dim():
    x = torch.randn(4, 100)
    with pytest.raises(ValueError, match="multiple of block=64"):
        fake_quant_fp8(x, 64)
    with pytest.raises(ValueError, match="multiple of block=128"):
        quantize_act(x)


# ---------------------------------------------------------------- FP8 block weights


def tiled_weight(n: int, k: int, seed: int) -> torch.Tensor:
    """Random weight whose 128x128 tiles have very different magnitudes (one tile below the floor)."""
    gen = torch.Generator().manual_seed(seed)
    tiles = pow2(torch.randint(-12, 6, (-(-n // 128), -(-k // 128)), generator=gen), torch.float32)
    tiles[0, -1] = 1e-7
    mult = tiles.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    return torch.randn(n, k, generator=gen) * mult


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("scale_dtype", ["e8m0", "float32"])
@pytest.mark.parametrize("shape", [(256, 384), (300, 260)])
def test_quantize_fp8_block_matches_float64_rule(scale_dtype, shape, wdtype):
    n, k = shape
    w = tiled_weight(n, k, seed=5).double() * (1 + 2.0**-30)  # fp64: not fp32-exact
    w[0, :4] = DOUBLE_ROUNDING_TRAP  # tile (0, 0) amax 448 -> scale 1
    w = w.to(wdtype)
    wq, scale = quantize_fp8_block(w, scale_dtype=scale_dtype)
    nb, kb = -(-n // 128), -(-k // 128)
    assert wq.dtype == torch.float8_e4m3fn and wq.shape == (n, k) and scale.shape == (nb, kb)
    assert scale.dtype == (torch.float8_e8m0fnu if scale_dtype == "e8m0" else torch.float32)

    w64 = w.to(torch.float64)
    amax = torch.zeros(nb, kb, dtype=torch.float64)
    for a in range(nb):  # tile loop only in the reference, over a handful of tiles
        for c in range(kb):
            amax[a, c] = w64[128 * a : 128 * a + 128, 128 * c : 128 * c + 128].abs().max()
    s_ref = ref_scales(amax)
    s_got = e8m0_to_float(scale) if scale_dtype == "e8m0" else scale
    assert torch.equal(s_got.to(torch.float64), s_ref)

    s_el = s_ref.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    q_ref = ref_e4m3_rne((w64 / s_el).clamp(-448, 448))
    assert torch.equal(wq.view(torch.uint8), q_ref)
    if wdtype == torch.float64:
        assert wq[0, :4].float().tolist() == [448.0, 1.125, -1.125, 1.0]

    deq = dequantize_fp8_block(wq, scale)
    assert deq.dtype == torch.float32
    q = E4M3_TABLE[q_ref.long()]
    assert torch.equal(deq.to(torch.float64), q * s_el)
    assert bool(((deq.to(torch.float64) - w64).abs() <= half_ulp_e4m3(q) * s_el).all())
    assert torch.equal(dequantize_fp8_block(wq, scale, dtype=torch.bfloat16).to(torch.float64), q * s_el)


def test_dequantize_fp8_block_random_bytes_all_scale_forms():
    gen = torch.Generator().manual_seed(6)
    n, k = 256, 200
    codes = torch.randint(0, 256, (n, k), generator=gen)
    codes = torch.where(codes & 0x7F == 0x7F, codes - 1, codes)  # no NaN codes
    sbytes = torch.randint(0, 255, (2, 2), generator=gen)
    sbytes[0, 0] = 0  # 2^-127: subnormal scale must not be flushed
    wq = codes.to(torch.uint8).view(torch.float8_e4m3fn)
    s64 = torch.ldexp(torch.ones(2, 2, dtype=torch.float64), sbytes.double() - 127)
    expected = E4M3_TABLE[codes] * s64.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    forms = [sbytes.to(torch.uint8), sbytes.to(torch.uint8).view(torch.float8_e8m0fnu), s64.to(torch.float32)]
    for scale in forms:
        assert torch.equal(dequantize_fp8_block(wq, scale), expected.to(torch.float32))
        got_bf16 = dequantize_fp8_block(wq, scale, dtype=torch.bfloat16)
        assert torch.equal(got_bf16, expected.to(torch.bfloat16))


def test_fp8_block_errors_name_the_tensor():
    w = torch.randn(256, 256)
    w[3, 7] = math.nan
    with pytest.raises(ValueError, match="layers.1.attn.wq_a.weight.*NaN"):
        quantize_fp8_block(w, name="layers.1.attn.wq_a.weight")
    with pytest.raises(ValueError, match="scale_dtype"):
        quantize_fp8_block(torch.randn(128, 128), scale_dtype="bf16")
    with pytest.raises(ValueError, match="2-D"):
        quantize_fp8_block(torch.randn(2, 128, 128))
    wq, scale = quantize_fp8_block(torch.randn(256, 256))
    with pytest.raises(ValueError, match=r"wo_b.weight: scale shape \(1, 2\)"):
        dequantize_fp8_block(wq, scale[:1], name="wo_b.weight")
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        dequantize_fp8_block(wq.float(), scale)
