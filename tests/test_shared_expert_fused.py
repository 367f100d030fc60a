"""Kernel-mode shared expert with w1/w3 fused into one w13 (CPU side).

The Triton kernels need CUDA (tests/gpu/test_swiglu.py); here `fp8_linear` and `swiglu` are swapped
for their torch references, so `Expert.forward`'s fused path (w13 GEMM -> SwiGLU -> w2) runs on the
CPU and is checked against the separate w1/w3 math: the same Expert before fusing, the torch-mode
Expert (bf16 dequantised weights, `F.silu`), and a float64 re-derivation of the spec.
"""
from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import dsv4.model.deepseek_v4 as dv
from dsv4.checkpoint.writer import random_master_weights, tiny_config
from dsv4.kernels.fp8_linear import fp8_linear_ref
from dsv4.kernels.swiglu import swiglu_ref
from dsv4.model.linear import FP8, quantized_weights
from dsv4.model.moe import Expert
from dsv4.model.numerics import resolve_numerics
from dsv4.quant.fp8 import dequantize_fp8_block, fake_quant_fp8

D, I, LIMIT = 256, 384, 10.0  # I = 3 blocks of 128: the w1/w3 seam sits inside no block
BF16 = torch.bfloat16
# the modules (dsv4.kernels re-exports a function named fp8_linear over its submodule's name)
fp8_mod = importlib.import_module("dsv4.kernels.fp8_linear")
swiglu_mod = importlib.import_module("dsv4.kernels.swiglu")


@pytest.fixture
def torch_kernels(monkeypatch):
    """The Triton entry points replaced by their references (the kernel-mode code paths stay)."""
    monkeypatch.setattr(fp8_mod, "fp8_linear", lambda x, w, s, config=None, out_dtype=BF16:
                        fp8_linear_ref(x, w, s, out_dtype))
    monkeypatch.setattr(swiglu_mod, "swiglu", swiglu_ref)


def _masters(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # w1/w3 rows of different magnitudes per 128-block: distinct scales on both sides of the seam
    mag = lambda n: torch.exp2(torch.randint(-2, 3, (n // 128, 1), generator=g).float()).repeat_interleave(128, 0)
    return {"w1": torch.randn(I, D, generator=g) * 0.3 * mag(I), "w3": torch.randn(I, D, generator=g) * 0.3 * mag(I),
            "w2": torch.randn(D, I, generator=g) * 0.05}


def _expert(masters: dict[str, torch.Tensor], kernel: bool) -> Expert:
    cfg = SimpleNamespace(hidden_size=D, moe_intermediate_size=I, swiglu_limit=LIMIT)
    numerics = resolve_numerics("reference")
    if kernel:
        with quantized_weights("fp4"):
            e = Expert(cfg, BF16, numerics, FP8)
        for name, w in masters.items():
            getattr(e, name).load_master(f"shared_experts.{name}.weight", w)
        return e
    e = Expert(cfg, BF16, numerics, FP8)  # torch mode: the quantised masters, dequantised to bf16
    ref = _expert(masters, kernel=True)
    for name in masters:
        lin = getattr(ref, name)
        getattr(e, name).weight.data.copy_(dequantize_fp8_block(lin.weight, lin.scale, torch.float32))
    return e


def _inputs(m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, D, generator=g) * torch.exp2(torch.randint(-3, 4, (m, 1), generator=g).float())).to(BF16)
    return x, torch.rand(m, generator=g) * 1.5 + 0.1


def _ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 steps between two bf16 tensors (+0 and -0 are the same point)."""
    def order(t):
        i = t.contiguous().view(torch.int16).int()
        return torch.where(i >= 0, i, -(i & 0x7FFF))
    return (order(a) - order(b)).abs()


def _rederive(e: Expert, x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """float64 spec math with the reference's rounding points (bf16 gate/up, z, output)."""
    f64 = torch.float64
    w = {n: dequantize_fp8_block(getattr(e, n).weight, getattr(e, n).scale, f64) for n in ("w1", "w2", "w3")}
    xq = fake_quant_fp8(x, 128).to(f64)
    gate = (xq @ w["w1"].T).to(BF16).to(f64).clamp(max=LIMIT)
    up = (xq @ w["w3"].T).to(BF16).to(f64).clamp(-LIMIT, LIMIT)
    z = gate / (1 + torch.exp(-gate)) * up
    if weight is not None:
        z = weight.to(f64)[:, None] * z
    return (fake_quant_fp8(z.to(BF16), 128).to(f64) @ w["w2"].T).to(BF16)


def test_fuse_w13_stacks_and_aliases():
    e = _expert(_masters(1), kernel=True)
    w1, w3 = e.w1.weight.clone(), e.w3.weight.clone()
    s1, s3 = e.w1.scale.clone(), e.w3.scale.clone()
    e.fuse_w13()
    assert e.w13_weight.shape == (2 * I, D) and e.w13_scale.shape == (2 * I // 128, D // 128)
    assert torch.equal(e.w13_weight.view(torch.uint8), torch.cat([w1, w3]).view(torch.uint8))
    assert torch.equal(e.w13_scale, torch.cat([s1, s3]))
    # no second copy: w1/w3 are row views of w13, still listed as the model's parameters/buffers
    assert e.w1.weight.data_ptr() == e.w13_weight.data_ptr()
    assert e.w3.weight.data_ptr() == e.w13_weight[I:].data_ptr()
    assert e.w3.scale.data_ptr() == e.w13_scale[I // 128:].data_ptr()
    assert {"w1.weight", "w3.weight"} <= dict(e.named_parameters()).keys() and "w3.scale" in dict(e.named_buffers())
    before = e.w13_weight
    e.fuse_w13()  # a second finalize keeps the fused weight
    assert e.w13_weight is before
    # a reload of w3 after fusing writes through into w13, w1's half untouched
    new_w3 = _masters(2)["w3"]
    e.w3.load_master("shared_experts.w3.weight", new_w3)
    q3 = _expert({"w1": new_w3, "w3": new_w3, "w2": _masters(1)["w2"]}, kernel=True).w3
    assert torch.equal(e.w13_weight[I:].view(torch.uint8), q3.weight.view(torch.uint8))
    assert torch.equal(e.w13_scale[I // 128:], q3.scale)
    assert torch.equal(e.w13_weight[:I].view(torch.uint8), w1.view(torch.uint8))


@pytest.mark.parametrize("with_weight", [False, True])
def test_fused_path_equals_separate_w1_w3_math(torch_kernels, with_weight):
    masters = _masters(3)
    x, weight = _inputs(9, seed=4)
    x[0] *= 64  # a large row: gate and up both cross the clamp
    weight = weight if with_weight else None
    e = _expert(masters, kernel=True)
    separate = e(x, weight)  # before fusing: w1 and w3 GEMMs, then the torch ops with F.silu
    e.fuse_w13()
    fused = e(x, weight)
    assert fused.dtype == BF16 and fused.shape == (9, D)
    torch_mode = _expert(masters, kernel=False)(x, weight)  # the model's torch path
    want = _rederive(e, x, weight)

    g13 = fp8_linear_ref(x, e.w13_weight, e.w13_scale).float()
    assert bool((g13[:, :I] > LIMIT).any()) and bool((g13[:, I:].abs() > LIMIT).any())  # clamps exercised
    # same fp32 math on the same values: bit-equal, up to CPU GEMM summation order (1 bf16 ulp)
    for other, what in ((separate, "unfused kernel-mode path"), (torch_mode, "torch-mode Expert")):
        d = _ulps(fused, other)
        assert int(d.max()) <= 1, what
        assert float((d == 0).float().mean()) > 0.98, what
    # float64 spec: a flipped bf16 rounding of gate/up/z moves the output by a few bf16 ulps at most
    err = float((fused.double() - want.double()).norm() / want.double().norm())
    assert err < 2e-3, err
    assert float((_ulps(fused, want) <= 1).float().mean()) > 0.98


def test_fused_path_fp32_partial_for_tp(torch_kernels):
    """A TP slice asks for the unrounded w2 partial (out_dtype=fp32): the fused path passes it on."""
    masters = _masters(5)
    x, _ = _inputs(4, seed=6)
    e = _expert(masters, kernel=True)
    e.fuse_w13()
    part = e(x, out_dtype=torch.float32)
    assert part.dtype == torch.float32
    z = swiglu_ref(fp8_linear_ref(x, e.w13_weight, e.w13_scale), LIMIT)
    assert torch.equal(part, fp8_linear_ref(z, e.w2.weight, e.w2.scale, torch.float32))
    assert torch.equal(part.to(BF16), e(x))


def test_swiglu_ref_matches_float64_and_silu():
    g = torch.Generator().manual_seed(7)
    gate_up = (torch.randn(33, 2 * I, generator=g) * 8).to(BF16)
    gate_up[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -200.0])
    gate_up[1, I:I + 3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    weight = torch.rand(33, generator=g) + 0.5
    z = swiglu_ref(gate_up, LIMIT, weight)
    gate, up = gate_up[:, :I].double(), gate_up[:, I:].double()
    want = (weight.double()[:, None] * F.silu(gate.clamp(max=LIMIT)) * up.clamp(-LIMIT, LIMIT)).to(BF16)
    assert torch.equal(z.isnan(), want.isnan()) and bool(z[0, 0].isnan() and z[0, 2].isnan() and z[1, 0].isnan())
    ok = ~want.isnan()
    assert int(_ulps(z[ok], want[ok]).max()) <= 1  # fp32 vs float64 math: one rounding flip at most
    silu = (weight[:, None] * (F.silu(gate_up[:, :I].float().clamp(max=LIMIT))
                               * gate_up[:, I:].float().clamp(-LIMIT, LIMIT))).to(BF16)
    assert torch.equal(z[ok].view(torch.int16), silu[ok].view(torch.int16))  # the formula torch's silu uses


@pytest.mark.parametrize("bad,match", [
    (lambda: (torch.ones(2, 7, dtype=BF16), None), r"\[\.\.\., 2I\]"),
    (lambda: (torch.ones(2, 8), None), "bf16"),
    (lambda: (torch.ones(2, 8, dtype=BF16), torch.ones(3)), "weight"),
    (lambda: (torch.ones(2, 8, dtype=BF16), torch.ones(2, dtype=torch.float64)), "weight"),
])
def test_swiglu_rejects_bad_input(bad, match):
    gate_up, weight = bad()
    with pytest.raises(ValueError, match=match):
        swiglu_ref(gate_up, LIMIT, weight)


@pytest.fixture
def kernel_mode(monkeypatch):
    monkeypatch.setattr(dv, "resolve_kernels", lambda kernels, dtype, device: "triton")


def test_finalize_fuses_shared_experts_whole_and_tp_sliced(kernel_mode):
    """pack_experts at finalize fuses every shared expert, on one process and on a TP rank (its
    w13 = its w1 slice over its w3 slice)."""
    cfg = tiny_config("fp4", "sliding,csa", num_hash_layers=1, moe_intermediate_size=256)
    masters = random_master_weights(cfg, seed=8)

    def build(parallel):
        m = dv.DeepseekV4ForCausalLM(cfg, BF16, parallel=parallel, kernels="triton")
        m.load_weights(masters.items())
        m.finalize_weights()
        return m

    whole, part = build(None), build(SimpleNamespace(tp=2, ep=1, rank=1))
    for wb, pb in zip(whole.layers, part.layers):
        w, p = wb.ffn.shared_experts, pb.ffn.shared_experts
        i = w.w1.out_features
        assert torch.equal(w.w13_weight[:i].view(torch.uint8), w.w1.weight.view(torch.uint8))
        assert p.w13_weight.shape == (i, cfg.hidden_size)  # half of each of w1 and w3
        h = i // 2
        for lo, src in ((0, slice(h, i)), (h, slice(i + h, 2 * i))):  # rank 1: the second halves
            assert torch.equal(p.w13_weight[lo:lo + h].view(torch.uint8), w.w13_weight[src].view(torch.uint8))
        assert torch.equal(p.w13_scale, torch.cat([w.w13_scale[1:2], w.w13_scale[3:4]]))
