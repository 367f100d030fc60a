"""Grouped wo_a kernel (bf16 x FP8 weight, `dsv4/kernels/grouped_w8a16.py`) vs its torch reference.

Fresh random inputs; poisoned allocator before every kernel call. Kernel and reference take the same
exact products and sum them in fp32 in different orders, so after the bf16 rounding most elements are
bit-equal and the rest one bf16 ulp apart (plus an fp32 summation allowance where a sum cancels).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

# "cpu" only for checking the tests themselves under TRITON_INTERPRET=1 (slow)
DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
F64 = torch.float64


def _inputs(t: int, g: int, r: int, din: int, scale_fmt: str, seed: int):
    """x with per-128-block magnitudes 2^-6..2^6, FP8 weight with block scales 2^-4..2^4 apart."""
    from dsv4.quant.fp8 import quantize_fp8_block

    gen = torch.Generator(DEV).manual_seed(seed)
    x = torch.randn(t, g, din, generator=gen, device=DEV)
    x = x * torch.exp2(torch.randint(-6, 7, (t, g, din // 128), generator=gen, device=DEV).float()).repeat_interleave(
        128, -1)
    w = torch.randn(g * r, din, generator=gen, device=DEV) * 0.02
    w = w * torch.exp2(torch.randint(-4, 5, (g * r // 128, din // 128), generator=gen, device=DEV).float()
                       ).repeat_interleave(128, 0).repeat_interleave(128, 1)
    wq, s = quantize_fp8_block(w, "e8m0" if scale_fmt in ("e8m0", "uint8") else "float32")
    if scale_fmt == "uint8":
        s = s.view(torch.uint8)
    elif scale_fmt == "float32_any":  # not powers of two: the weight must round to bf16 like the reference's
        s = s * (1 + torch.rand(s.shape, generator=gen, device=DEV))
    return x.to(torch.bfloat16), wq, s


def _abs_products(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Σ_i |x · w| per output (float64), the scale of the fp32 summation error."""
    from dsv4.quant.fp8 import dequantize_fp8_block

    t, g, din = x.shape
    w = dequantize_fp8_block(weight, scale, F64).view(g, -1, din).abs()
    return torch.einsum("tgi,gri->tgr", x.to(F64).abs(), w)


def _assert_bf16_sum_close(y, ref, mag, din, min_equal=0.9, what=""):
    """Mostly bit-equal; every element within one bf16 ulp + 8·sqrt(Din)·2^-24·Σ|x·w|."""
    assert y.shape == ref.shape and y.dtype == torch.bfloat16, f"{what}: {tuple(y.shape)} {y.dtype}"
    assert torch.isfinite(y).all(), f"{what}: non-finite output (unwritten elements?)"
    yd, rd = y.to(F64), ref.to(F64)
    top = torch.maximum(yd.abs(), rd.abs()).clamp_min(2.0**-126)
    allowed = torch.exp2(torch.floor(torch.log2(top)) - 7) + 8 * math.sqrt(din) * 2.0**-24 * mag
    over = (yd - rd).abs() > allowed
    assert not over.any(), f"{what}: {int(over.sum())} elements beyond one ulp, e.g. {yd[over][:4]} vs {rd[over][:4]}"
    equal = float((y.view(torch.int16) == ref.view(torch.int16)).double().mean())
    assert equal >= min_equal, f"{what}: only {equal:.3f} of the elements bit-equal"


def _check(x, w, s, config=None, what=""):
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16, grouped_linear_w8a16_ref

    y = grouped_linear_w8a16(x, w, s, config)
    ref = grouped_linear_w8a16_ref(x, w, s)
    _assert_bf16_sum_close(y, ref, _abs_products(x, w, s), x.shape[-1], what=what)
    return y


@pytest.mark.parametrize("scale_fmt", ["e8m0", "uint8", "float32", "float32_any"])
@pytest.mark.parametrize("t", [1, 3, 16, 64, 300])
def test_default_config_small(t, scale_fmt, poison):
    x, w, s = _inputs(t, 2, 256, 512, scale_fmt, seed=t * 7 + len(scale_fmt))
    poison()
    _check(x, w, s, what=f"T={t} {scale_fmt}")


@pytest.mark.parametrize("t", [5] + ([1, 16, 64, 300] if DEV == "cuda" else []))
def test_flash_shape(t, poison):
    """Flash wo_a: G = 8, R = 1024, Din = 4096 (the interpreter runs only T = 5)."""
    x, w, s = _inputs(t, 8, 1024, 4096, "e8m0", seed=t)
    poison()
    _check(x, w, s, what=f"flash T={t}")


def _configs():
    from dsv4.kernels.grouped_w8a16 import GroupedConfig

    return [
        GroupedConfig(bn=64, bm=16),
        GroupedConfig(bn=64, bm=32, num_stages=6),
        GroupedConfig(bn=128, bm=64, num_warps=8),
        GroupedConfig(bn=128, bm=128, num_warps=8, num_stages=3),
        GroupedConfig(bn=64, bm=128, num_warps=4, num_stages=2),
        GroupedConfig(bn=64, bm=16, bit_convert=False),
    ]


@pytest.mark.parametrize("cfg_idx", range(6))
@pytest.mark.parametrize("scale_fmt", ["e8m0", "float32"])
def test_every_config(cfg_idx, scale_fmt, poison):
    """Each launch shape on a token count that leaves a partial tile (and G = 1)."""
    cfg = _configs()[cfg_idx]
    for t, g in ((37, 1), (70, 3)):
        x, w, s = _inputs(t, g, 128 * (1 + cfg_idx % 2), 384, scale_fmt, seed=cfg_idx * 13 + t)
        poison()
        _check(x, w, s, cfg, what=f"{cfg} T={t} G={g} {scale_fmt}")


@pytest.mark.parametrize("cfg_idx", [0, 3, 5])
def test_every_e4m3_code_exact(cfg_idx, poison):
    """One-hot tokens read single weights back: y[t, g, r] = W[g*R + r, t] exactly, for all 254 finite
    e4m3 codes under E8M0 scales from 2^-107 to 2^13 (the bit conversion, the 2^120 rebias and the
    per-block scale are all exact, so this is bit-equal)."""
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16, grouped_linear_w8a16_ref
    from dsv4.quant.fp8 import dequantize_fp8_block

    g, r, din = 2, 128, 256
    gen = torch.Generator(DEV).manual_seed(cfg_idx)
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8, device=DEV)
    idx = torch.randperm(g * r * din, generator=gen, device=DEV) % codes.numel()  # each code ~258 times
    w = codes[idx].view(g * r, din).view(torch.float8_e4m3fn)
    scale_bytes = torch.tensor([20, 100, 119, 127, 128, 134, 135, 140], dtype=torch.uint8, device=DEV)
    s = scale_bytes[torch.randint(0, 8, (g * r // 128, din // 128), generator=gen, device=DEV)]
    x = torch.zeros(din, g, din, device=DEV)
    x[torch.arange(din), :, torch.arange(din)] = 1.0  # token t reads input column t
    x = x.to(torch.bfloat16)
    poison()
    y = grouped_linear_w8a16(x, w, s, _configs()[cfg_idx])
    want = dequantize_fp8_block(w, s, torch.bfloat16).view(g, r, din).permute(2, 0, 1)
    assert torch.equal(y, want)  # value equality: a -0.0 weight sums to +0.0 with the other tokens' zeros
    assert torch.equal(y, grouped_linear_w8a16_ref(x, w, s))


def test_strided_input_and_determinism(poison):
    """x as a non-contiguous view (the rows of a wider buffer); two calls are bit-identical."""
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16

    x, w, s = _inputs(9, 2, 128, 256, "e8m0", seed=99)
    wide = torch.randn(9, 2, 384, device=DEV).to(torch.bfloat16)
    wide[..., 64:320] = x
    xv = wide[..., 64:320]
    assert not xv.is_contiguous()
    poison()
    y = _check(xv, w, s, what="strided x")
    poison()
    assert torch.equal(y, grouped_linear_w8a16(x, w, s))


def test_empty_and_bad_inputs():
    from dsv4.kernels.grouped_w8a16 import GroupedConfig, grouped_linear_w8a16

    x, w, s = _inputs(2, 2, 128, 256, "e8m0", seed=1)
    assert grouped_linear_w8a16(x[:0], w, s).shape == (0, 2, 128)
    with pytest.raises(ValueError, match="x must be bf16"):
        grouped_linear_w8a16(x.float(), w, s)
    with pytest.raises(ValueError, match="does not fit x"):
        grouped_linear_w8a16(x[:, :1], w[:200], s)
    with pytest.raises(ValueError, match="scale shape"):
        grouped_linear_w8a16(x, w, s[:, :1])
    with pytest.raises(ValueError, match="weight must be contiguous"):
        grouped_linear_w8a16(x, w.t().contiguous().t(), s)
    with pytest.raises(ValueError, match="bn=96"):
        grouped_linear_w8a16(x, w, s, GroupedConfig(bn=96, bm=16))
    with pytest.raises(ValueError, match="bm=8"):
        grouped_linear_w8a16(x, w, s, GroupedConfig(bn=64, bm=8))
    with pytest.raises(ValueError, match="split_k=-1"):
        grouped_linear_w8a16(x, w, s, GroupedConfig(bn=64, bm=16, split_k=-1))


# --------------------------------------------------------------------------- split K, reduced in the launch

SPLIT_KEY = "grouped_w8a16 split-K"


def _exact_inputs(t: int, g: int, r: int, din: int, scale_fmt: str, seed: int):
    """Inputs whose every fp32 partial sum is exact, in any order and grouping: x = ±{0..3}·2^{-1,0,1},
    weights ±{8..15}/8·2^{-1,0} (normal e4m3), block scales 2^{-1,0,1}, so every product is a multiple of
    2^-6 and Σ|x·w·s| < 2^24·2^-6 (asserted). Every split count must then give the reference's bits."""
    gen = torch.Generator(DEV).manual_seed(seed)
    x = torch.randint(-3, 4, (t, g, din), generator=gen, device=DEV).float()
    x = (x * torch.exp2(torch.randint(-1, 2, (t, g, din // 128), generator=gen, device=DEV).float()
                        ).repeat_interleave(128, -1)).to(torch.bfloat16)
    mant = torch.randint(8, 16, (g * r, din), generator=gen, device=DEV).float() / 8
    sign = torch.randint(0, 2, (g * r, din), generator=gen, device=DEV).float() * 2 - 1
    w = (sign * mant * torch.exp2(torch.randint(-1, 1, (g * r, din), generator=gen, device=DEV).float()))
    wq = w.to(torch.float8_e4m3fn)
    assert torch.equal(wq.float(), w)
    sb = torch.randint(126, 129, (g * r // 128, din // 128), generator=gen, device=DEV, dtype=torch.uint8)
    s = sb.view(torch.float8_e8m0fnu) if scale_fmt == "e8m0" else torch.exp2(sb.float() - 127)
    assert float(_abs_products(x, wq, s).max()) < 2.0**18  # 2^24 units of 2^-6: no fp32 sum rounds
    return x, wq, s


def _counters_zero() -> bool:
    """Every launch leaves its arrival counters at zero (the next launch and graph replays rely on it)."""
    import importlib

    cache = importlib.import_module("dsv4.kernels._triton")._counter_cache
    return all(int(b.count_nonzero()) == 0 for key, bufs in cache.items() if key[0] == SPLIT_KEY for b in bufs)


def _split_cfg(t: int, split: int, **kw):
    from dsv4.kernels.grouped_w8a16 import GroupedConfig, pick_grouped_config

    return GroupedConfig(**{**pick_grouped_config(t).__dict__, "split_k": split, **kw})


def test_auto_split_rule():
    """2..4 programs per SM where the K range allows, >= MIN_SPLIT_KBLOCKS K blocks per split, powers of two."""
    from dsv4.kernels.grouped_w8a16 import MIN_SPLIT_KBLOCKS, NUM_SMS, _auto_split

    assert _auto_split(8 * 1024 // 64, 4096 // 128) == 4  # Flash decode: 512 programs of 8 K blocks
    assert _auto_split(2 * 128 // 64, 1024 // 128) == 2  # the small shapes below really split
    assert _auto_split(8 * 1024 // 64, 4096 // 128, per_sm=2) == 2  # Flash at T = 33..64 (bm 64)
    for tiles in (1, 2, 16, 33, 66, 128, 132, 200, 264, 600):
        for kblocks in (1, 3, 4, 8, 12, 32, 56, 64):
            s = _auto_split(tiles, kblocks)
            assert s >= 1 and s & (s - 1) == 0
            if s > 1:
                assert tiles * s <= 4 * NUM_SMS and kblocks // s >= MIN_SPLIT_KBLOCKS
            # doubling again would overfill the grid or starve a split
            assert tiles * s * 2 > 4 * NUM_SMS or kblocks // (s * 2) < MIN_SPLIT_KBLOCKS


# (T, G, scale) cases; the interpreter runs a subset (each K block of each program costs ~6 ms there)
_SPLIT_CASES = [(t, g, f) for t in (1, 5, 16, 64) for g in (1, 2, 8) for f in ("e8m0", "float32")]
_SPLIT_CASES_CPU = [(1, 1, "e8m0"), (1, 8, "float32"), (5, 2, "float32"), (16, 1, "float32"), (16, 2, "e8m0"),
                    (64, 1, "e8m0"), (64, 2, "float32")]


@pytest.mark.parametrize("t,g,scale_fmt", _SPLIT_CASES if DEV == "cuda" else _SPLIT_CASES_CPU)
def test_split_exact_sums(t, g, scale_fmt, poison):
    """With exact sums every split count (1, 2, 3 uneven, auto = 2, 8 = one K block each, 11 > K blocks)
    must give the reference's bits: no partial lost, doubled, read stale or left unwritten (poisoned)."""
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16, grouped_linear_w8a16_ref

    x, w, s = _exact_inputs(t, g, 128, 1024, scale_fmt, seed=1000 + 10 * t + g)
    ref = grouped_linear_w8a16_ref(x, w, s)
    assert ref.abs().max() > 0
    splits = (1, 2, 3, 0, 8, 11) if DEV == "cuda" or g == 1 else (1, 3, 0)
    for split in splits:
        poison()
        y = grouped_linear_w8a16(x, w, s, _split_cfg(t, split))
        assert torch.equal(y, ref), f"split {split}: {int((y != ref).sum())} elements differ"
    assert _counters_zero()


@pytest.mark.parametrize("scale_fmt,split", [("e8m0", 0), ("uint8", 3), ("float32", 2), ("float32_any", 0)])
def test_split_random_inputs(scale_fmt, split, poison):
    """General values: within the rounding allowance of the reference and of the unsplit kernel."""
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16

    t, g, din = 5, 2, 1024
    x, w, s = _inputs(t, g, 128, din, scale_fmt, seed=2000 + split)
    poison()
    y = _check(x, w, s, _split_cfg(t, split), what=f"split {split} {scale_fmt}")
    poison()
    y1 = grouped_linear_w8a16(x, w, s, _split_cfg(t, 1))
    _assert_bf16_sum_close(y, y1, _abs_products(x, w, s), din, what=f"split {split} vs split 1")
    assert _counters_zero()


def test_split_repeated_calls_and_graph(poison, graph_replays):
    """The same calls again, alternating two inputs: bit-identical every time (a fixed reduction order; a
    counter left non-zero would finish tiles early or never). On CUDA also captured in a graph and replayed."""
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16

    t, g, r, din, calls = (5, 2, 128, 1024, 4) if DEV == "cpu" else (5, 8, 1024, 4096, 20)
    xs = [_inputs(t, g, r, din, "e8m0", seed=3000 + i)[0] for i in range(2)]
    _, w, s = _inputs(t, g, r, din, "e8m0", seed=3002)
    for cfg in (_split_cfg(t, 3), None):  # forced uneven split 3, and the default decode config (auto split)
        first = [grouped_linear_w8a16(x, w, s, cfg) for x in xs]
        assert not torch.equal(first[0], first[1])
        for i in range(calls):
            poison()
            assert torch.equal(grouped_linear_w8a16(xs[i % 2], w, s, cfg), first[i % 2]), f"{cfg} call {i}"
        assert _counters_zero()
        if DEV != "cuda":
            continue
        graph_replays(lambda xx: grouped_linear_w8a16(xx, w, s, cfg), xs[0].clone(), xs, first, str(cfg))
        assert _counters_zero()


@pytest.mark.skipif(DEV != "cuda", reason="Flash size: too slow for the interpreter")
@pytest.mark.parametrize("t", [1, 5, 16, 64])
def test_split_flash_exact_and_deterministic(t, poison):
    """Flash wo_a (G = 8, R = 1024, Din = 4096): every split count gives the reference's bits on exact sums,
    and on general values ten repeated default-config calls are bit-identical."""
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16, grouped_linear_w8a16_ref

    for fmt in ("e8m0", "float32"):
        x, w, s = _exact_inputs(t, 8, 1024, 4096, fmt, seed=4000 + t)
        ref = grouped_linear_w8a16_ref(x, w, s)
        for split in (1, 2, 4, 8, 0, 32):
            poison()
            assert torch.equal(grouped_linear_w8a16(x, w, s, _split_cfg(t, split)), ref), f"{fmt} split {split}"
    x, w, s = _inputs(t, 8, 1024, 4096, "e8m0", seed=4100 + t)
    y = grouped_linear_w8a16(x, w, s)
    for i in range(10):
        assert torch.equal(grouped_linear_w8a16(x, w, s), y), f"call {i}"
    assert _counters_zero()


@pytest.mark.parametrize("scale_dtype", ["e8m0", "float32"])
@pytest.mark.parametrize("n,k", [(128, 128), (8192, 4096), (384, 1024)])
def test_dequant_fp8_weight_bit_exact(n, k, scale_dtype, poison):
    """Prefill's one-launch bf16 copy of an FP8 weight equals the torch dequantisation bit for bit."""
    from dsv4.kernels.grouped_w8a16 import dequant_fp8_weight
    from dsv4.quant.fp8 import dequantize_fp8_block, quantize_fp8_block

    gen = torch.Generator(DEV).manual_seed(n + k)
    w = torch.randn(n, k, generator=gen, device=DEV)
    w *= torch.exp2(torch.randint(-12, 6, (n // 128, k // 128), generator=gen, device=DEV).float()
                    ).repeat_interleave(128, 0).repeat_interleave(128, 1)
    q, s = quantize_fp8_block(w, scale_dtype)
    poison()
    got = dequant_fp8_weight(q, s)
    assert got.dtype == torch.bfloat16 and torch.equal(got, dequantize_fp8_block(q, s, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="does not fit"):
        dequant_fp8_weight(q, torch.cat([s, s], 1))
