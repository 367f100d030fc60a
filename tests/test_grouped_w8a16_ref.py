"""`grouped_linear_w8a16_ref` (grouped wo_a, bf16 x FP8 weight) against a float64 re-derivation.

The float64 side decodes e4m3 from its bit layout and E8M0 as 2^(b-127) itself (checkpoint_format.md §5),
dequantises as the reference model does (fp32 product, rounded to bf16), sums each output exactly in
float64 and rounds once to bf16. The reference under test sums in fp32, so the two agree exactly except
where the exact sum lies within fp32 summation error of a bf16 rounding boundary (1 ulp apart then).
"""

from __future__ import annotations

import math

import pytest
import torch

from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16_ref

F64 = torch.float64


def _e4m3_table() -> torch.Tensor:
    """Value of each e4m3fn code: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7F/0xFF NaN."""
    vals = []
    for code in range(256):
        e, m = (code >> 3) & 0xF, code & 7
        mag = math.nan if code & 0x7F == 0x7F else (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        vals.append(-mag if code & 0x80 else mag)
    return torch.tensor(vals, dtype=F64)


E4M3 = _e4m3_table()


def expected_f64(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bf16 of the exact sum, Σ|x·w| per output) for x [T, G, Din], weight e4m3 [G*R, Din]."""
    t, g, din = x.shape
    r = weight.shape[0] // g
    w = E4M3[weight.view(torch.uint8).long()]
    if scale.dtype == torch.float32:
        s = scale.to(F64)
    else:
        s = 2.0 ** (scale.view(torch.uint8).to(F64) - 127.0)
    s = s.repeat_interleave(128, 0).repeat_interleave(128, 1)
    w = (w * s).to(torch.float32).to(torch.bfloat16).to(F64).view(g, r, din)  # the model's bf16 dequantisation
    xd = x.to(F64)
    exact = torch.einsum("tgi,gri->tgr", xd, w)
    mag = torch.einsum("tgi,gri->tgr", xd.abs(), w.abs())
    return exact.to(torch.bfloat16), mag


def bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 values at |v| (float64), 2^-133 at the bottom of the range."""
    a = v.to(F64).abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


def assert_bf16_sum_close(y: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, din: int,
                          min_equal: float = 0.9, what: str = "") -> None:
    """Both bf16 roundings of one sum, accumulated in different (fp32) orders: mostly bit-equal, the rest one
    ulp apart, plus a fp32 summation-error allowance (8·sqrt(Din)·2^-24·Σ|x·w|) that only matters where the
    sum cancels to far below its terms."""
    assert y.shape == ref.shape and y.dtype == ref.dtype == torch.bfloat16, f"{what}: {y.shape} {y.dtype}"
    assert torch.isfinite(y).all(), f"{what}: non-finite output"
    diff = (y.to(F64) - ref.to(F64)).abs()
    allowed = bf16_ulp(torch.maximum(y.to(F64).abs(), ref.to(F64).abs())) + 8 * math.sqrt(din) * 2.0**-24 * mag
    bad = diff > allowed
    assert not bad.any(), f"{what}: {int(bad.sum())} elements beyond 1 ulp, worst {float((diff - allowed).max())}"
    equal = float((y.view(torch.int16) == ref.view(torch.int16)).double().mean())
    assert equal >= min_equal, f"{what}: only {equal:.3f} of the elements bit-equal"


def make_inputs(t: int, g: int, r: int, din: int, scale_fmt: str, seed: int):
    """Fresh random x (per-128-block magnitudes 2^-6..2^6) and an FP8 weight with varied block scales."""
    from dsv4.quant.fp8 import quantize_fp8_block

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, g, din, generator=gen)
    x = x * torch.exp2(torch.randint(-6, 7, (t, g, din // 128), generator=gen).float()).repeat_interleave(128, -1)
    w = torch.randn(g * r, din, generator=gen) * 0.02
    w = w * torch.exp2(torch.randint(-4, 5, (g * r // 128, din // 128), generator=gen).float()).repeat_interleave(
        128, 0).repeat_interleave(128, 1)
    wq, s = quantize_fp8_block(w, "e8m0" if scale_fmt in ("e8m0", "uint8") else "float32")
    if scale_fmt == "uint8":
        s = s.view(torch.uint8)
    elif scale_fmt == "float32_any":  # not powers of two: the dequantised weight rounds to bf16
        s = s * (1 + torch.rand(s.shape, generator=gen))
    return x.to(torch.bfloat16), wq, s


@pytest.mark.parametrize("scale_fmt", ["e8m0", "uint8", "float32", "float32_any"])
@pytest.mark.parametrize("t,g,r,din", [(5, 1, 128, 512), (3, 8, 256, 384), (17, 2, 128, 1024)])
def test_ref_matches_float64(t, g, r, din, scale_fmt):
    x, w, s = make_inputs(t, g, r, din, scale_fmt, seed=t * 100 + g * 10 + len(scale_fmt))
    y = grouped_linear_w8a16_ref(x, w, s)
    assert y.shape == (t, g, r)
    exact, mag = expected_f64(x, w, s)
    assert_bf16_sum_close(y, exact, mag, din, min_equal=0.95, what=f"{scale_fmt} {t}x{g}x{r}x{din}")


def test_scale_encodings_agree():
    """float8_e8m0fnu, raw uint8 bytes and the same values as float32 are one weight."""
    x, w, s = make_inputs(4, 2, 128, 256, "e8m0", seed=7)
    y = grouped_linear_w8a16_ref(x, w, s)
    assert torch.equal(y, grouped_linear_w8a16_ref(x, w, s.view(torch.uint8)))
    assert torch.equal(y, grouped_linear_w8a16_ref(x, w, s.to(torch.float32)))


def test_groups_are_independent():
    """Group g uses only x[:, g] and weight rows g*R .. (g+1)*R: perturbing group 1 leaves group 0 alone."""
    x, w, s = make_inputs(3, 2, 128, 256, "e8m0", seed=11)
    y = grouped_linear_w8a16_ref(x, w, s)
    x2 = x.clone()
    x2[:, 1] = -x2[:, 1]
    w2 = w.clone()
    w2[128:] = w2[:128]
    y2 = grouped_linear_w8a16_ref(x2, w2, s)
    assert torch.equal(y2[:, 0], y[:, 0])
    assert not torch.equal(y2[:, 1], y[:, 1])


def test_empty_tokens():
    x, w, s = make_inputs(1, 2, 128, 256, "e8m0", seed=3)
    assert grouped_linear_w8a16_ref(x[:0], w, s).shape == (0, 2, 128)


def test_bad_inputs_raise():
    x, w, s = make_inputs(2, 2, 128, 256, "e8m0", seed=5)
    with pytest.raises(ValueError, match="x must be bf16"):
        grouped_linear_w8a16_ref(x.float(), w, s)
    with pytest.raises(ValueError, match="x must be bf16"):
        grouped_linear_w8a16_ref(x[0], w, s)
    with pytest.raises(ValueError, match="Din a multiple of 128"):
        grouped_linear_w8a16_ref(x[..., :200], w, s)
    with pytest.raises(ValueError, match="weight must be 2-D float8_e4m3fn"):
        grouped_linear_w8a16_ref(x, w.to(torch.bfloat16), s)
    with pytest.raises(ValueError, match="does not fit x"):
        grouped_linear_w8a16_ref(x[:, :, :128], w, s)
    with pytest.raises(ValueError, match="does not fit x"):  # 3 groups of 256/3 rows
        grouped_linear_w8a16_ref(torch.zeros(2, 3, 256, dtype=torch.bfloat16), w, s)
    with pytest.raises(ValueError, match="scale shape"):
        grouped_linear_w8a16_ref(x, w, s[:1])
    with pytest.raises(ValueError, match="scale must be"):
        grouped_linear_w8a16_ref(x, w, s.to(torch.float16))
