"""FP8 block linear kernels vs the torch references (dsv4.quant codecs), fresh random inputs."""

from __future__ import annotations

import os

import pytest
import torch

# "cpu" only for checking the tests themselves under TRITON_INTERPRET=1 (slow; use -k)
DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def _x(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Rows and 128-blocks with very different magnitudes, so scales differ per block (never zeros)."""
    x = torch.randn(m, k, generator=gen, device=DEV)
    x = x * torch.exp2(torch.randint(-6, 7, (m, k // 128), generator=gen, device=DEV).float()).repeat_interleave(128, 1)
    return x.to(torch.bfloat16)


def _weight(n: int, k: int, gen: torch.Generator, scale_dtype: str):
    from dsv4.quant.fp8 import quantize_fp8_block

    w = torch.randn(n, k, generator=gen, device=DEV) * 0.02
    w = w * torch.exp2(torch.randint(-3, 4, (n // 128, k // 128), generator=gen, device=DEV).float()).repeat_interleave(
        128, 0).repeat_interleave(128, 1)
    return quantize_fp8_block(w, scale_dtype)


@pytest.mark.parametrize("m,k", [(1, 128), (37, 4096), (300, 7168), (4, 16384)])
def test_act_quant_bit_exact(m, k, poison):
    from dsv4.kernels.fp8_linear import act_quant, act_quant_ref

    gen = torch.Generator(DEV).manual_seed(m * 7 + k)
    x = _x(m, k, gen)
    x[0, :128] = 1e-6  # a block under the amax floor
    poison()
    q, s = act_quant(x)
    qr, sr = act_quant_ref(x)
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8))
    assert torch.equal(s, sr)


SHAPES = [  # (N, K): Flash and Pro linears, plus a fused w1+w3
    (1024, 4096), (512, 4096), (32768, 1024), (4096, 8192), (4096, 2048), (8192, 1024),
    (1536, 7168), (512, 7168), (7168, 3072), (6144, 7168),
]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [1, 8, 37, 64, 300])
def test_fp8_linear_default_config(n, k, m, poison, close_bf16):
    from dsv4.kernels.fp8_linear import fp8_linear, fp8_linear_ref

    gen = torch.Generator(DEV).manual_seed(n + k + m)
    x = _x(m, k, gen)
    w, s = _weight(n, k, gen, "e8m0")
    poison()
    close_bf16(fp8_linear(x, w, s), fp8_linear_ref(x, w, s), what=f"fp8_linear {m}x{n}x{k}")


@pytest.mark.parametrize("n,k", [(1024, 4096), (32768, 1024), (4096, 8192), (7168, 3072)])
@pytest.mark.parametrize("m", [255, 256, 300, 1000, 4096])
def test_fp8_linear_cublas_and_triton_backends(n, k, m, poison, close_bf16):
    """From CUBLAS_MIN_ROWS rows "auto" runs cuBLAS's blockwise `_scaled_mm` (1x128 / 128x128 scales): both
    backends against the reference, on E8M0 and float32 weight scales, and the scales cached once per tensor."""
    import importlib

    fl = importlib.import_module("dsv4.kernels.fp8_linear")  # the package exports the function under that name
    from dsv4.kernels import fp8_cublas
    gen = torch.Generator(DEV).manual_seed(n + k + m + 11)
    x = _x(m, k, gen)
    for scale_dtype in ("e8m0", "float32"):
        w, s = _weight(n, k, gen, scale_dtype)
        ref = fl.fp8_linear_ref(x, w, s)
        for backend in ("auto", "cublas", "triton"):
            poison()
            close_bf16(fl.fp8_linear(x, w, s, backend=backend), ref, what=f"{backend} {m}x{n}x{k} {scale_dtype}")
    rejected = [key for key in fp8_cublas._CUBLAS_REJECTED if key[1:] == (n, k)]
    assert not rejected, f"cuBLAS refused {rejected}"
    s8 = _weight(n, k, gen, "e8m0")[1]
    assert fp8_cublas._cublas_weight_scale(s8) is fp8_cublas._cublas_weight_scale(s8)  # decoded once
    s8.view(torch.uint8).add_(1)  # an in-place write: decoded again
    assert torch.equal(fp8_cublas._cublas_weight_scale(s8), fl._weight_scale_f32(s8))


@pytest.mark.parametrize("n,k", [(4096, 128), (4096, 4096), (4096, 1024)])
@pytest.mark.parametrize("m", [1, 64, 300])
def test_fp8_linear_fp32_partial(n, k, m, poison):
    """out_dtype=float32 (row-parallel partial sums): the unrounded fp32 result of the reference GEMM."""
    from dsv4.kernels.fp8_linear import fp8_linear, fp8_linear_ref

    gen = torch.Generator(DEV).manual_seed(n + k + m + 5)
    x = _x(m, k, gen)
    w, s = _weight(n, k, gen, "float32")
    poison()
    y = fp8_linear(x, w, s, out_dtype=torch.float32)
    ref = fp8_linear_ref(x, w, s, out_dtype=torch.float32)
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    err = float((y.double() - ref.double()).norm() / ref.double().norm())
    # Hopper's FP8 MMA accumulates with a shortened mantissa (measured 1.2e-4 here), well under the
    # ~1e-3 that one bf16 rounding adds; and the output really is unrounded fp32:
    assert err < 5e-4, err
    assert float((y != y.to(torch.bfloat16).float()).float().mean()) > 0.9


def _configs():
    from dsv4.kernels.fp8_linear import LinearConfig

    return [
        LinearConfig(bm=16, bn=64, swap_ab=True, fuse_quant=True, split_k=0),
        LinearConfig(bm=32, bn=128, swap_ab=True, fuse_quant=False, split_k=4),
        LinearConfig(bm=16, bn=64, swap_ab=False, fuse_quant=True, split_k=2),
        LinearConfig(bm=64, bn=128, swap_ab=False, fuse_quant=False, split_k=1),
        LinearConfig(bm=128, bn=128, swap_ab=False, fuse_quant=False, num_warps=8),
        LinearConfig(bm=128, bn=64, swap_ab=False, fuse_quant=True, num_warps=4, num_stages=3),
    ]


@pytest.mark.parametrize("cfg_idx", range(6))
@pytest.mark.parametrize("scale_dtype", ["e8m0", "float32"])
def test_fp8_linear_every_config(cfg_idx, scale_dtype, poison, close_bf16):
    from dsv4.kernels.fp8_linear import fp8_gemm, fp8_gemm_ref, fp8_linear, fp8_linear_ref
    from dsv4.quant.fp8 import quantize_act

    cfg = _configs()[cfg_idx]
    gen = torch.Generator(DEV).manual_seed(cfg_idx * 11 + len(scale_dtype))
    for m, n, k in ((3, 512, 1024), (130, 1024, 2048)):
        x = _x(m, k, gen)
        w, s = _weight(n, k, gen, scale_dtype)
        poison()
        close_bf16(fp8_linear(x, w, s, cfg), fp8_linear_ref(x, w, s), what=f"{cfg} {m}x{n}x{k}")
        q, sa = quantize_act(x)
        poison()
        close_bf16(fp8_gemm(q, sa, w, s, cfg), fp8_gemm_ref(q, sa, w, s), what=f"gemm {cfg}")


@pytest.mark.parametrize("m,g,ro", [(1, 8, 1024), (33, 16, 1024), (200, 8, 256)])
def test_grouped_wo_a(m, g, ro, poison, close_bf16):
    from dsv4.kernels.fp8_linear import (
        grouped_fp8_linear,
        grouped_fp8_linear_ref,
        grouped_linear_bf16,
        grouped_linear_bf16_ref,
    )
    from dsv4.quant.fp8 import dequantize_fp8_block

    k = 4096
    gen = torch.Generator(DEV).manual_seed(m + g)
    x = _x(m * g, k, gen).view(m, g, k)
    w, s = _weight(g * ro, k, gen, "e8m0")
    poison()
    close_bf16(grouped_fp8_linear(x, w, s), grouped_fp8_linear_ref(x, w, s), what="grouped fp8")
    wb = dequantize_fp8_block(w, s, torch.bfloat16)
    close_bf16(grouped_linear_bf16(x, wb), grouped_linear_bf16_ref(x, wb), rel=1e-2, what="grouped bf16")


def test_bad_inputs_raise():
    from dsv4.kernels.fp8_linear import fp8_linear

    gen = torch.Generator(DEV).manual_seed(0)
    w, s = _weight(256, 512, gen, "e8m0")
    with pytest.raises(ValueError, match="does not fit"):
        fp8_linear(_x(2, 256, gen), w, s)
    with pytest.raises(ValueError, match="scale shape"):
        fp8_linear(_x(2, 512, gen), w, s[:1])
    with pytest.raises(ValueError, match="bf16"):
        fp8_linear(_x(2, 512, gen).float(), w, s)
    with pytest.raises(ValueError, match="backend must be"):
        fp8_linear(_x(2, 512, gen), w, s, backend="cutlass")
    with pytest.raises(ValueError, match="bf16 out only"):
        fp8_linear(_x(2, 512, gen), w, s, backend="cublas", out_dtype=torch.float32)


# --------------------------------------------------------------------------- split K, reduced in the GEMM launch


def _x_exact(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Random values on the e4m3 grid (3 mantissa bits, 2^9 range per 128-block, block scales 2^±6): the
    activation quantisation is exact, so the result does not depend on fp32->e4m3 rounding (which
    Triton's CPU interpreter gets wrong when the mantissa carries into the exponent)."""
    mant = 1 + torch.randint(0, 8, (m, k), generator=gen, device=DEV).float() / 8
    sign = torch.randint(0, 2, (m, k), generator=gen, device=DEV).float() * 2 - 1
    e = torch.randint(-2, 7, (m, k), generator=gen, device=DEV).float()
    block = torch.randint(-6, 7, (m, k // 128), generator=gen, device=DEV).float().repeat_interleave(128, 1)
    return (sign * mant * torch.exp2(e + block)).to(torch.bfloat16)


def _split_cfg(split: int, kind: str = "swap"):
    from dsv4.kernels.fp8_linear import LinearConfig

    if kind == "swap":  # the decode shape
        return LinearConfig(bm=16, bn=64, swap_ab=True, fuse_quant=True, split_k=split)
    if kind == "swap_preq":
        return LinearConfig(bm=32, bn=128, swap_ab=True, fuse_quant=False, split_k=split)
    return LinearConfig(bm=16, bn=64, swap_ab=False, fuse_quant=True, split_k=split)


def _counters_zero() -> bool:
    """Every launch leaves its arrival counters at zero (the next launch and graph replays rely on it)."""
    import importlib

    mod = importlib.import_module("dsv4.kernels._triton")
    return all(int(b.count_nonzero()) == 0 for bufs in mod._counter_cache.values() for b in bufs)


def _kernel_bf16(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 as the kernel's `.to(bfloat16)` rounds: to nearest even on the GPU; Triton's CPU interpreter
    truncates (round toward zero) instead."""
    if DEV == "cpu":
        return (t.view(torch.int32) & -65536).view(torch.float32).to(torch.bfloat16)
    return t.to(torch.bfloat16)


@pytest.mark.parametrize("split", [2, 3, 4, 8])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_split_k_vs_reference(split, out_dtype, poison, close_bf16):
    from dsv4.kernels.fp8_linear import fp8_linear, fp8_linear_ref

    m, n, k = 3, 256, 128 * 24  # 24 K blocks: every split divides; n = 4 tiles of 64
    gen = torch.Generator(DEV).manual_seed(100 + split)
    x = _x_exact(m, k, gen)
    w, s = _weight(n, k, gen, "e8m0")
    poison()
    y = fp8_linear(x, w, s, _split_cfg(split), out_dtype=out_dtype)
    ref = fp8_linear_ref(x, w, s, out_dtype=torch.float32)
    assert y.dtype == out_dtype and _counters_zero()
    if out_dtype == torch.bfloat16:
        close_bf16(y, _kernel_bf16(ref), what=f"split {split}")
    else:
        assert torch.isfinite(y).all()
        err = float((y.double() - ref.double()).norm() / ref.double().norm())
        assert err < 5e-4, err


def _k_slice(x, w, s, i: int, kb: int):
    """Inputs of split i alone (kb K blocks): activation blocks quantise independently, so slicing K is exact."""
    c = slice(i * kb * 128, (i + 1) * kb * 128)
    return x[:, c].contiguous(), w[:, c].contiguous(), s[:, i * kb : (i + 1) * kb].contiguous()


@pytest.mark.parametrize("split", [2, 3, 4, 6])
@pytest.mark.parametrize("kind", ["swap", "swap_preq", "plain"])
def test_split_k_bit_identical_to_two_step(split, kind, poison):
    """One launch == the same kernel run per K slice (split 1, fp32 out) and the partials summed s = 0..S-1 in
    fp32 from zero, then rounded once: the fused reduction changes no bit."""
    from dsv4.kernels.fp8_linear import fp8_linear

    m, n, k = 5, 256, 128 * 12
    kb = k // 128 // split
    gen = torch.Generator(DEV).manual_seed(200 + split)
    x = _x(m, k, gen)
    w, s = _weight(n, k, gen, "float32" if split % 2 else "e8m0")
    parts = [fp8_linear(*_k_slice(x, w, s, i, kb), _split_cfg(1, kind), out_dtype=torch.float32) for i in range(split)]
    total = torch.zeros_like(parts[0])
    for p in parts:
        total += p
    for out_dtype in (torch.float32, torch.bfloat16):
        poison()
        y = fp8_linear(x, w, s, _split_cfg(split, kind), out_dtype=out_dtype)
        want = total if out_dtype == torch.float32 else _kernel_bf16(total)
        assert torch.equal(y, want), f"split {split} {kind} {out_dtype}"
    assert _counters_zero()


def test_split_k_repeated_launches_and_graph(poison, graph_replays):
    """Back-to-back launches (and CUDA-graph replays) alternating two inputs: each gives its own result, bit for
    bit. A counter left non-zero would leave tiles unwritten or summed early; a racy reduction would vary."""
    from dsv4.kernels.fp8_linear import fp8_linear

    m, n, k = (2, 128, 512) if DEV == "cpu" else (4, 4096, 7168)
    gen = torch.Generator(DEV).manual_seed(300)
    xs = [_x(m, k, gen), _x(m, k, gen)]
    w, s = _weight(n, k, gen, "e8m0")
    cfgs = [_split_cfg(4), None]  # forced split 4, and the default decode config (auto split)
    for cfg in cfgs:
        first = [fp8_linear(x, w, s, cfg) for x in xs]
        assert not torch.equal(first[0], first[1])
        for i in range(20):
            if i % 5 == 0:
                poison()
            assert torch.equal(fp8_linear(xs[i % 2], w, s, cfg), first[i % 2]), f"{cfg} call {i}"
        assert _counters_zero()
        if DEV != "cuda":
            continue
        graph_replays(lambda xx: fp8_linear(xx, w, s, cfg), xs[0].clone(), xs, first, str(cfg))
        assert _counters_zero()


@pytest.mark.parametrize("split", [0, 2, 8])  # 0: auto (4 here)
def test_split_k_grouped(split, poison, close_bf16):
    """Grouped launch (grid z = groups, counters per tile and group): each group bit-equal to its own
    fp8_linear with the same config, and close to the reference."""
    from dsv4.kernels.fp8_linear import fp8_linear, fp8_linear_ref, grouped_fp8_linear

    m, g, ro, k = 2, 3, 128, 1024
    gen = torch.Generator(DEV).manual_seed(400 + split)
    x = _x_exact(m * g, k, gen).view(m, g, k)
    w, s = _weight(g * ro, k, gen, "e8m0")
    cfg = _split_cfg(split)
    poison()
    y = grouped_fp8_linear(x, w, s, cfg)
    for i in range(g):
        wi, si = w[i * ro : (i + 1) * ro], s[i * ro // 128 : (i + 1) * ro // 128]
        assert torch.equal(y[:, i], fp8_linear(x[:, i], wi, si, cfg)), f"group {i}"
        ref = _kernel_bf16(fp8_linear_ref(x[:, i], wi, si, out_dtype=torch.float32))
        close_bf16(y[:, i], ref, what=f"grouped split {split}, group {i}")
    assert torch.equal(grouped_fp8_linear(x, w, s, cfg), y)  # counters were reset by the first launch
    assert _counters_zero()


def test_split_counters_cached_and_grown():
    """One zeroed buffer per device, reused; a larger need appends a larger one and keeps the old alive."""
    import importlib

    mod = importlib.import_module("dsv4.kernels.fp8_linear")
    dev = torch.device(DEV, 0) if DEV == "cuda" else torch.device(DEV)
    a = mod._split_counters(dev, 10)
    assert a.dtype == torch.int32 and a.numel() >= 1 << 16 and int(a.count_nonzero()) == 0
    assert mod._split_counters(dev, a.numel()) is a
    b = mod._split_counters(dev, a.numel() + 1)
    assert b.numel() > a.numel() and int(b.count_nonzero()) == 0
    cache = importlib.import_module("dsv4.kernels._triton")._counter_cache
    assert mod._split_counters(dev, 5) is b and any(t is a for t in cache["fp8_linear split-K", dev, 0])
