"""`fp8_linear(x, norm=(weight, eps))`: the FP8 linear of x's weighted RMSNorm, the norm applied by the GEMM as it
quantises its input (decode sizes) -- against `norm_rope` then `fp8_linear`, and against the torch reference."""

from __future__ import annotations

import os

import pytest
import torch
from test_fp8_linear import _weight, _x
from test_moe_gemv_mma import _gpu_like_casts  # noqa: F401  (autouse: the interpreter rounds like the GPU)

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def _norm_weight(k: int, gen: torch.Generator) -> torch.Tensor:
    return (1.0 + 0.5 * torch.randn(k, generator=gen, device=DEV)).to(torch.bfloat16)


def _unfused(x, w, s, nw, eps, config=None):
    from dsv4.kernels.fp8_linear import fp8_linear
    from dsv4.kernels.norm_rope import WEIGHTED, norm_rope

    return fp8_linear(norm_rope(x, norm=WEIGHTED, weight=nw, eps=eps), w, s, config=config)


# (M, N, K, scale dtype, K split): K = 384 pads the norm's row tile to 512; the splits sum partials of the normed input
CASES = [(1, 256, 384, "e8m0", 1), (3, 256, 256, "float32", 2), (16, 128, 512, "e8m0", 4)]
if DEV == "cuda":
    CASES += [(1, 32768, 1024, "e8m0", 0), (4, 65536, 1536, "e8m0", 0), (1, 4096, 8192, "float32", 0)]


@pytest.mark.parametrize("m,n,k,scales,split", CASES)
def test_norm_in_the_gemm_matches_norm_rope_then_linear(m, n, k, scales, split, poison, close_bf16):
    from dsv4.kernels.fp8_linear import fp8_linear, fp8_linear_ref
    from dsv4.kernels.linear_config import LinearConfig

    gen = torch.Generator(DEV).manual_seed(1000 * m + n + k)
    x = _x(m, k, gen)
    w, s = _weight(n, k, gen, scales)
    nw, eps = _norm_weight(k, gen), 1e-6
    cfg = LinearConfig(bm=16, bn=128, swap_ab=True, fuse_quant=True, split_k=split) if split else None
    poison()
    fused = fp8_linear(x, w, s, config=cfg, norm=(nw, eps))
    poison()
    unfused = _unfused(x, w, s, nw, eps, cfg)
    same = float((fused == unfused).float().mean())
    print(f"norm in the GEMM {m}x{n}x{k}: {same:.4f} of the outputs bit-identical to norm_rope + fp8_linear")
    # the same fp32 operations per element; only a row's sum of squares runs in another order (128-column chunks
    # in turn, not one tile): a last-bit flip of its factor moves a few outputs by a rounding step
    assert same > 0.9, f"only {same:.3f} of the outputs bit-identical"
    close_bf16(fused, unfused, rel=2e-3, what="fused vs unfused")
    close_bf16(fused, fp8_linear_ref(x, w, s, norm=(nw, eps)), rel=1e-2, what="fused vs the torch reference")


def test_sizes_without_the_fused_quant_norm_first(poison, close_bf16):
    """Where the GEMM does not quantise its input (here 24 rows), `norm` runs `norm_rope` first: the same bits."""
    from dsv4.kernels.fp8_linear import fp8_linear

    gen = torch.Generator(DEV).manual_seed(7)
    x = _x(24, 256, gen)
    w, s = _weight(128, 256, gen, "e8m0")
    nw = _norm_weight(256, gen)
    poison()
    assert torch.equal(fp8_linear(x, w, s, norm=(nw, 1e-6)), _unfused(x, w, s, nw, 1e-6))


def test_bad_norm_weight_names_it():
    from dsv4.kernels.fp8_linear import fp8_linear

    gen = torch.Generator(DEV).manual_seed(3)
    x = _x(1, 256, gen)
    w, s = _weight(128, 256, gen, "e8m0")
    with pytest.raises(ValueError, match="norm weight"):
        fp8_linear(x, w, s, norm=(_norm_weight(128, gen), 1e-6))
