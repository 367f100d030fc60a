"""Clamped SwiGLU kernel (the shared expert's epilogue on the fused w13 output) vs torch, fresh inputs.

What is compared, element by element on the bf16 outputs:
* `swiglu` vs `swiglu_ref` (torch, silu written as `x / (1 + exp(-x))`, the formula of torch's CUDA
  silu): the same fp32 operations; on CUDA expected bit-equal, asserted as <= 1 bf16 ulp with >= 99.9%
  exact (the interpreter's numpy exp may differ from torch's exp by an fp32 ulp);
* `swiglu` vs the model's torch code (`F.silu(gate.clamp(max=L)) * up.clamp(-L, L)`, times the weight):
  <= 1 bf16 ulp, >= 99% exact;
* NaN in, NaN out at the same places (torch.clamp and silu propagate NaN); ±inf as torch.
"""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

# "cpu" only for checking the tests themselves under TRITON_INTERPRET=1
DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
LIMIT = 10.0


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 steps (+0 and -0 are the same point)."""
    def order(t):
        i = t.contiguous().view(torch.int16).int()
        return torch.where(i >= 0, i, -(i & 0x7FFF))
    return (order(a) - order(b)).abs()


def _gate_up(m: int, i: int, gen: torch.Generator, row_pad: int = 0) -> torch.Tensor:
    """bf16 [m, 2i] spanning ~1e-3..40 in magnitude (both clamps hit), optionally a strided row view."""
    g = torch.randn(m, 2 * i + row_pad, generator=gen, device=DEV)
    g = g * torch.exp2(torch.randint(-8, 3, (m, 2 * i + row_pad), generator=gen, device=DEV).float()) * 4
    return g.to(torch.bfloat16)[:, : 2 * i]


def _torch_model_math(gate_up: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The Expert's torch path on the same bf16 gate/up."""
    i = gate_up.shape[-1] // 2
    z = F.silu(gate_up[..., :i].float().clamp(max=LIMIT)) * gate_up[..., i:].float().clamp(-LIMIT, LIMIT)
    if weight is not None:
        z = weight.unsqueeze(-1) * z
    return z.to(torch.bfloat16)


def _assert_close(z: torch.Tensor, want: torch.Tensor, exact_frac: float, what: str) -> None:
    assert z.shape == want.shape and z.dtype == torch.bfloat16, what
    assert torch.equal(z.isnan(), want.isnan()), f"{what}: NaN positions differ (unwritten elements?)"
    ok = ~want.isnan()
    d = _ulps(z[ok], want[ok])
    assert int(d.max()) <= 1, f"{what}: {int(d.max())} bf16 ulps apart"
    frac = float((d == 0).float().mean())
    assert frac >= exact_frac, f"{what}: only {frac:.4f} of the elements bit-equal"


@pytest.mark.parametrize("m,i", [(1, 2048), (5, 384), (64, 1536), (129, 3072)])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32, torch.bfloat16])
def test_swiglu_matches_torch(m, i, weight_dtype, poison):
    from dsv4.kernels.swiglu import swiglu, swiglu_ref

    gen = torch.Generator(DEV).manual_seed(m * 31 + i + (0 if weight_dtype is None else weight_dtype.itemsize))
    gate_up = _gate_up(m, i, gen, row_pad=128 if m == 5 else 0)  # m=5: a row stride of 2I + 128
    weight = None
    if weight_dtype is not None:
        weight = (torch.rand(m, generator=gen, device=DEV) * 1.5 + 0.1).to(weight_dtype)
    g, u = gate_up[:, :i].float(), gate_up[:, i:].float()
    assert bool((g > LIMIT).any()) and bool((u < -LIMIT).any()) and bool((u > LIMIT).any())
    poison()
    z = swiglu(gate_up, LIMIT, weight)
    _assert_close(z, swiglu_ref(gate_up, LIMIT, weight), 0.999, "vs swiglu_ref")
    _assert_close(z, _torch_model_math(gate_up, weight), 0.99, "vs F.silu model math")
    assert not z.isnan().any()


def test_swiglu_special_values_and_leading_dims(poison):
    from dsv4.kernels.swiglu import swiglu

    gen = torch.Generator(DEV).manual_seed(11)
    i = 256
    gate_up = _gate_up(6, i, gen)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), -200.0, 1e-30, -0.0], device=DEV)
    gate_up[0, :6] = specials.to(torch.bfloat16)  # gate: NaN, clamped inf, -inf -> NaN, exp overflow -> -0
    gate_up[1, i:i + 6] = specials.to(torch.bfloat16)  # up: NaN, clamped ±inf
    poison()
    z = swiglu(gate_up.view(2, 3, 2 * i), LIMIT)
    assert z.shape == (2, 3, i)
    want = _torch_model_math(gate_up, None).view(2, 3, i)
    _assert_close(z, want, 0.99, "special values")
    assert bool(z[0, 0, 0].isnan() and z[0, 0, 2].isnan() and z[0, 1, 0].isnan())
    assert torch.isfinite(z[0, 0, 1]) and torch.isfinite(z[0, 1, 1])


def test_swiglu_empty_and_bad_input():
    from dsv4.kernels.swiglu import swiglu

    assert swiglu(torch.empty(0, 256, dtype=torch.bfloat16, device=DEV), LIMIT).shape == (0, 128)
    with pytest.raises(ValueError, match="gate_up"):
        swiglu(torch.ones(2, 256, device=DEV), LIMIT)
    with pytest.raises(ValueError, match="weight"):
        swiglu(torch.ones(2, 256, dtype=torch.bfloat16, device=DEV), LIMIT, torch.ones(3, device=DEV))


@pytest.mark.parametrize("m", [1, 20])
def test_shared_expert_fused_matches_unfused(m, poison, close_bf16):
    """Kernel-mode shared expert: w13 GEMM -> swiglu -> w2 (after fuse_w13) vs the separate w1/w3
    GEMMs + torch ops (before), same FP8 weights; equal up to the GEMMs' fp32 summation order."""
    from types import SimpleNamespace

    from dsv4.model.linear import FP8, quantized_weights
    from dsv4.model.moe import Expert
    from dsv4.model.numerics import resolve_numerics

    d, i = 512, 384
    gen = torch.Generator(DEV).manual_seed(m + 40)
    cfg = SimpleNamespace(hidden_size=d, moe_intermediate_size=i, swiglu_limit=LIMIT)
    with quantized_weights("fp4"), torch.device(DEV):
        e = Expert(cfg, torch.bfloat16, resolve_numerics("reference"), FP8)
    for name, (n, k) in (("w1", (i, d)), ("w3", (i, d)), ("w2", (d, i))):
        w = torch.randn(n, k, generator=gen, device=DEV) * (0.5 if name != "w2" else 0.05)
        getattr(e, name).load_master(f"shared_experts.{name}.weight", w)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    weight = torch.rand(m, generator=gen, device=DEV) + 0.5
    unfused = e(x, weight)
    e.fuse_w13()
    poison()
    fused = e(x, weight)
    close_bf16(fused, unfused, what="fused vs unfused shared expert")
