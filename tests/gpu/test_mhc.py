"""mHC Triton kernels vs float64 re-derivations of spec §2.2 / §2.10 (via the CPU model functions on
float64 inputs) and vs the bf16 torch references; fresh random inputs, poisoned outputs."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
KW = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
# (tokens, hidden): decode sizes, a prefill block and Flash width
SHAPES = [(1, 256), (5, 128), (70, 512), (3, 4096), (64, 4096), (1000, 4096)]
REL = 2e-3  # bf16 results of the same fp32 math
if DEV == "cpu":  # Triton interpreter: tiny shapes only; it truncates fp32 -> bf16 instead of rounding
    SHAPES = [(1, 64), (5, 128), (19, 64)]
    REL = 1e-2


def _streams(t: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """Four streams with different magnitudes per stream and token (never zeros)."""
    mag = torch.exp2(torch.randint(-3, 4, (t, 4, 1), generator=gen, device=DEV).float())
    return (torch.randn(t, 4, d, generator=gen, device=DEV) * mag).to(torch.bfloat16)


def _params(n_mix: int, n_scale: int, d: int, gen: torch.Generator):
    # |fn . xhat| ~ sqrt(4d) * 0.02 / ... keeps the sigmoids and the Sinkhorn logits in a live range
    fn = torch.randn(n_mix, 4 * d, generator=gen, device=DEV) * (2.0 / (4 * d) ** 0.5)
    base = torch.randn(n_mix, generator=gen, device=DEV) * 0.5
    scale = torch.rand(n_scale, generator=gen, device=DEV) + 0.5
    return fn, base, scale


def _f64_pre(x, fn, base, scale):
    from dsv4.model.hyper import hc_pre as model_pre
    return model_pre(x.double(), fn.double(), base.double(), scale.double(), **KW)


def _rel(y, ref) -> float:
    y, ref = y.double(), ref.double()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize("t,d", SHAPES)
@pytest.mark.parametrize("with_norm", [False, True])
def test_hc_pre(t, d, with_norm, poison, close_bf16):
    from dsv4.kernels.mhc import hc_pre, hc_pre_ref

    gen = torch.Generator(DEV).manual_seed(t * 131 + d + with_norm)
    x = _streams(t, d, gen)
    fn, base, scale = _params(24, 3, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16) if with_norm else None
    poison()
    u, post, comb = hc_pre(x, fn, base, scale, norm_weight=w, **KW)
    _, post64, comb64 = _f64_pre(x, fn, base, scale)
    assert torch.isfinite(post).all() and torch.isfinite(comb).all()
    assert _rel(post, post64) < 1e-5, "post"
    assert _rel(comb, comb64) < 1e-4, "comb"
    # the last Sinkhorn step is a column normalisation: columns sum to ~1
    assert torch.allclose(comb.sum(1), torch.ones_like(comb.sum(1)), atol=1e-4)
    u_ref, post_ref, comb_ref = hc_pre_ref(x, fn, base, scale, norm_weight=w, **KW)
    close_bf16(u, u_ref, rel=REL, what="collapsed input")
    assert _rel(comb, comb_ref) < 1e-4


@pytest.mark.parametrize("t,d", SHAPES)
def test_hc_post(t, d, poison, close_bf16):
    from dsv4.kernels.mhc import hc_post, hc_post_ref

    gen = torch.Generator(DEV).manual_seed(7 * t + d)
    x = _streams(t, d, gen)
    f = torch.randn(t, d, generator=gen, device=DEV).to(torch.bfloat16)
    post = torch.rand(t, 4, generator=gen, device=DEV) * 2
    comb = torch.rand(t, 4, 4, generator=gen, device=DEV)
    poison()
    y = hc_post(f, x, post, comb)
    # float64 re-derivation: X'_k = post_k f + sum_j comb[j, k] X_j (comb indexed [source, destination])
    ref64 = post.double()[:, :, None] * f.double()[:, None, :] + torch.einsum(
        "tjk,tjd->tkd", comb.double(), x.double())
    close_bf16(y, ref64.to(torch.bfloat16), rel=REL, what="hc_post vs float64")
    close_bf16(y, hc_post_ref(f, x, post, comb), rel=REL, what="hc_post vs ref")


@pytest.mark.parametrize("t,d", SHAPES)
def test_hc_post_pre(t, d, poison, close_bf16):
    from dsv4.kernels.mhc import hc_post_pre, hc_post_pre_ref, prepare_mix

    gen = torch.Generator(DEV).manual_seed(11 * t + d)
    x = _streams(t, d, gen)
    f = torch.randn(t, d, generator=gen, device=DEV).to(torch.bfloat16)
    _, post0, comb0 = _f64_pre(x, *_params(24, 3, d, gen))
    post0, comb0 = post0.float(), comb0.float()
    fn, base, scale = _params(24, 3, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16)
    poison()
    xn, u, post, comb = hc_post_pre(f, x, post0, comb0, prepare_mix(fn), base, scale, norm_weight=w, **KW)
    xr, ur, post_r, comb_r = hc_post_pre_ref(f, x, post0, comb0, fn, base, scale, norm_weight=w, **KW)
    close_bf16(xn, xr, rel=REL, what="post output")
    _, post64, comb64 = _f64_pre(xn, fn, base, scale)  # pre of exactly what the kernel wrote
    assert _rel(post, post64) < 1e-5 and _rel(comb, comb64) < 1e-4
    close_bf16(u, ur, rel=REL, what="normed input")


@pytest.mark.parametrize("t,d", SHAPES)
@pytest.mark.parametrize("with_norm", [False, True])
def test_hc_head(t, d, with_norm, poison, close_bf16):
    from dsv4.kernels.mhc import hc_head, hc_head_ref
    from dsv4.model.hyper import hc_head as model_head

    gen = torch.Generator(DEV).manual_seed(5 * t + d + with_norm)
    x = _streams(t, d, gen)
    fn, base, scale = _params(4, 1, d, gen)
    w = (torch.rand(d, generator=gen, device=DEV) + 0.5).to(torch.bfloat16) if with_norm else None
    poison()
    y = hc_head(x, fn, base, scale, hc_eps=1e-6, norm_eps=1e-6, norm_weight=w)
    y64 = model_head(x.double(), fn.double(), base.double(), scale.double(), hc_eps=1e-6, norm_eps=1e-6)
    if w is not None:  # spec §2.10: y is rounded to bf16, then RMSNorm_norm
        y64 = y64.to(torch.bfloat16).double()
        y64 = w.double() * y64 * torch.rsqrt(y64.square().mean(-1, keepdim=True) + 1e-6)
    close_bf16(y, y64.to(torch.bfloat16), rel=REL, what="hc_head vs float64")
    close_bf16(y, hc_head_ref(x, fn, base, scale, hc_eps=1e-6, norm_eps=1e-6, norm_weight=w), rel=REL, what="hc_head vs ref")


def test_bad_input_names_tensor():
    from dsv4.kernels.mhc import hc_pre

    x = torch.randn(2, 3, 64, device=DEV).to(torch.bfloat16)  # 3 streams instead of 4
    with pytest.raises(ValueError, match="mHC x"):
        hc_pre(x, torch.randn(24, 192, device=DEV), torch.randn(24, device=DEV), torch.rand(3, device=DEV), **KW)
