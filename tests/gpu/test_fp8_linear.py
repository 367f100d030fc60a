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
