"""One-token CUDA-core FP8 linear (`dsv4.kernels.fp8_gemv`) vs the torch references, fresh random inputs."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")  # "cpu": TRITON_INTERPRET=1 checks of the tests themselves


def _x(shape, gen: torch.Generator) -> torch.Tensor:
    """128-blocks with very different magnitudes, so the activation scales differ per block."""
    x = torch.randn(*shape, generator=gen, device=DEV)
    k = shape[-1]
    mag = torch.exp2(torch.randint(-6, 7, (*shape[:-1], k // 128), generator=gen, device=DEV).float())
    return (x * mag.repeat_interleave(128, -1)).to(torch.bfloat16)


def _weight(n: int, k: int, gen: torch.Generator, scale_dtype: str):
    from dsv4.quant.fp8 import quantize_fp8_block

    w = torch.randn(n, k, generator=gen, device=DEV) * 0.02
    w = w * torch.exp2(torch.randint(-3, 4, (n // 128, k // 128), generator=gen, device=DEV).float()).repeat_interleave(
        128, 0).repeat_interleave(128, 1)
    return quantize_fp8_block(w, scale_dtype)


CONFIGS = [(32, 4, 0, 4), (16, 2, 1, 4), (64, 4, 2, 8), (16, 8, 0, 4)]  # bn, ku, split (0 = auto), warps


def _linear_case(m, n, k, cfg, scale_dtype, poison, close_bf16):
    from dsv4.kernels.fp8_gemv import GemvConfig, fp8_gemv
    from dsv4.kernels.fp8_linear import fp8_linear_ref

    gen = torch.Generator(DEV).manual_seed(n + 3 * k + cfg[0] + 17 * m)
    x = _x((m, k), gen)
    w, s = _weight(n, k, gen, scale_dtype)
    config = GemvConfig(*cfg)
    if k % (128 * config.ku):
        pytest.skip("K not a multiple of the step")
    ref = fp8_linear_ref(x, w, s)
    for _ in range(2):  # the second launch reuses the split-K counters the first one reset
        poison()
        close_bf16(fp8_gemv(x, w, s, config=config), ref, what=f"gemv {n}x{k} {config}")
    y32 = fp8_gemv(x, w, s, config=config, out_dtype=torch.float32)
    assert y32.dtype == torch.float32
    close_bf16(y32.to(torch.bfloat16), ref, what="fp32 out")


@pytest.mark.parametrize("n,k", [(1536, 4096), (32768, 1024), (4096, 8192), (4096, 2048), (512, 7168)])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("scale_dtype", ["e8m0", "float32"])
@pytest.mark.parametrize("m", [1, 3])
def test_gemv_is_the_fp8_linear(m, n, k, cfg, scale_dtype, poison, close_bf16):
    _linear_case(m, n, k, cfg, scale_dtype, poison, close_bf16)


@pytest.mark.parametrize("n,k", [(1536, 4096), (4096, 8192)])
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("m", [2, 4])
def test_gemv_rows(m, n, k, cfg, poison, close_bf16):
    """Every row against the same weight tile (2 and 4 rows: no masked rows)."""
    _linear_case(m, n, k, cfg, "e8m0", poison, close_bf16)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("m,scale_dtype", [(1, "e8m0"), (2, "float32"), (3, "e8m0")])
def test_gemv_is_the_grouped_w8a16(cfg, m, scale_dtype, poison, close_bf16):
    from dsv4.kernels.fp8_gemv import GemvConfig, fp8_gemv
    from dsv4.kernels.grouped_w8a16 import grouped_linear_w8a16_ref

    g, r, k = 8, 1024, 4096
    gen = torch.Generator(DEV).manual_seed(11 + cfg[0] + cfg[1] + m)
    x = _x((m, g, k), gen)
    w, s = _weight(g * r, k, gen, scale_dtype)
    if scale_dtype == "float32":  # not powers of two: each weight rounds to bf16 as w * S (the reference's)
        s = s * (1 + torch.rand(s.shape, generator=gen, device=DEV))
    poison()
    y = fp8_gemv(x, w, s, groups=g, quant_x=False, config=GemvConfig(*cfg))
    close_bf16(y, grouped_linear_w8a16_ref(x, w, s), what=f"grouped gemv {cfg}")


def test_gemv_refuses_shapes_it_cannot_tile():
    from dsv4.kernels.fp8_gemv import GemvConfig, fp8_gemv

    gen = torch.Generator(DEV).manual_seed(5)
    w, s = _weight(256, 384, gen, "float32")
    with pytest.raises(ValueError, match="does not tile"):  # 3 K blocks, steps of 2
        fp8_gemv(_x((1, 384), gen), w, s, config=GemvConfig(32, 2))
    with pytest.raises(ValueError, match="rows"):
        fp8_gemv(_x((5, 384), gen), w, s, config=GemvConfig(32, 1))
    with pytest.raises(ValueError, match="scale"):
        fp8_gemv(_x((1, 384), gen), w, s.to(torch.bfloat16), config=GemvConfig(32, 1))


def test_gemv_scale_layout_does_not_matter(poison):
    """A column-major scale (a transposed view) gives the same bits as the row-major one."""
    from dsv4.kernels.fp8_gemv import GemvConfig, fp8_gemv

    gen = torch.Generator(DEV).manual_seed(9)
    w, s = _weight(512, 1024, gen, "float32")
    x = _x((1, 1024), gen)
    s_cols = s.t().contiguous().t()
    assert s_cols.stride(-1) != 1
    poison()
    a = fp8_gemv(x, w, s, config=GemvConfig(32, 4, 2))
    b = fp8_gemv(x, w, s_cols, config=GemvConfig(32, 4, 2))
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("n,k", [(4096, 2048), (1536, 4096)])
def test_register_cap_gives_the_same_bits(n, k, poison, monkeypatch):
    """linear_config.GEMV_MAXNREG (a register cap, so that a GEMV CTA fits beside a persistent MoE CTA): the same
    instructions, so the same bits as the compiler's choice, at the model's launch shape (the shared expert's down,
    Flash's wq_a)."""
    from dsv4.kernels import linear_config
    from dsv4.kernels.fp8_gemv import fp8_gemv

    gen = torch.Generator(DEV).manual_seed(n + k)
    w, s = _weight(n, k, gen, "e8m0")
    x = _x((1, k), gen)
    config = linear_config.pick_gemv_config(1, n, k)
    assert config is not None
    outs = []
    for cap in (0, 104):
        monkeypatch.setattr(linear_config, "GEMV_MAXNREG", cap)
        poison()
        outs.append(fp8_gemv(x, w, s, config=config))
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), f"{n}x{k}: the cap changed the bits"
