"""Routed-expert MoE kernels (align, grouped GEMMs with SwiGLU, combine) vs the torch references."""

from __future__ import annotations

import os

import pytest
import torch
from test_moe_align import _topk  # the routing helper lives with the align tests

# "cpu" only for checking the tests themselves under TRITON_INTERPRET=1 (slow; use -k)
DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def _mxfp4_experts(e: int, d: int, i: int, gen: torch.Generator):
    from dsv4.kernels.moe import ExpertWeights

    def packed(n, kk):
        return torch.randint(0, 256, (e, n, kk // 2), generator=gen, device=DEV, dtype=torch.uint8).view(torch.int8)

    def scales(n, kk):  # E8M0 bytes around 2^-5: |W| up to ~0.2, gate/up often past the clamp
        return torch.randint(119, 125, (e, n, kk // 32), generator=gen, device=DEV, dtype=torch.uint8)

    return ExpertWeights("mxfp4", packed(i, d), scales(i, d), packed(d, i), scales(d, i), packed(i, d), scales(i, d))


def _fp8_experts(e: int, d: int, i: int, gen: torch.Generator, scale_dtype: str = "float32"):
    from dsv4.kernels.moe import ExpertWeights
    from dsv4.quant.fp8 import quantize_fp8_block

    def stack(n, kk):
        pairs = [quantize_fp8_block(torch.randn(n, kk, generator=gen, device=DEV) * 0.05, scale_dtype) for _ in range(e)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])

    w1, s1 = stack(i, d)
    w2, s2 = stack(d, i)
    w3, s3 = stack(i, d)
    return ExpertWeights("fp8", w1, s1, w2, s2, w3, s3)


def _configs():
    from dsv4.kernels.moe import MoEConfig

    return {
        "decode": MoEConfig(bm=16, bn1=64, bn2=64, quant_first=False, quant_out=False, num_stages=4),
        "decode_noasm": MoEConfig(bm=16, bn1=64, bn2=64, quant_first=True, quant_out=False, use_asm=False),
        "prefill": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=True, quant_out=True, warps1=8, warps2=8),
        "prefill_bf16z": MoEConfig(bm=64, bn1=128, bn2=128, quant_first=False, quant_out=False, warps1=8, warps2=8),
        "bm128_bn64": MoEConfig(bm=128, bn1=64, bn2=64, quant_first=True, quant_out=False, warps1=8, warps2=4),
        "swap": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, swap=True),
        "swap_bn64": MoEConfig(bm=16, bn1=64, bn2=64, quant_first=False, quant_out=False, swap=True),
        "gemv": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=32),
        "gemv_bn64": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, warps1=8,
                               gemv_unroll=4),
        "gemv_bn16_u1": MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=16, warps1=2,
                                  gemv_unroll=1),
    }


@pytest.mark.parametrize("cfg_name", ["decode", "decode_noasm", "prefill", "prefill_bf16z", "bm128_bn64", "swap",
                                      "swap_bn64", "gemv", "gemv_bn64", "gemv_bn16_u1", None])
@pytest.mark.parametrize("act", ["fp8", "bf16"])
@pytest.mark.parametrize("m", [1, 5, 64, 300])
def test_fused_moe_mxfp4(cfg_name, act, m, poison, close_bf16):
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    e, d, i, k = 16, 512, 256, 6
    gen = torch.Generator(DEV).manual_seed(m * 5 + len(act) + len(cfg_name or ""))
    experts = _mxfp4_experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _topk(m, e, k, gen, skew=m == 300)
    shared = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16) if m == 5 else None
    cfg = _configs()[cfg_name] if cfg_name else None
    poison()
    y = fused_moe(x, ids, w, packed, act=act, shared=shared, config=cfg)
    ref = fused_moe_ref(x, ids, w, experts, act=act, shared=shared)
    # z passes through an FP8 re-quantisation: an ulp of difference in silu can move one element by one
    # e4m3 step, hence a looser bound than a single GEMM
    close_bf16(y, ref, rel=1e-2, what=f"moe {act} {cfg_name} m={m}")


@pytest.mark.parametrize("m,rank_shape", [(1, False), (9, False), (200, False), (40, True), (200, True)])
def test_fused_moe_expert_parallel_partials(m, rank_shape, poison, close_bf16):
    """Two 'ranks' each computing their half of the experts (other ids -> -1) in fp32 add up to the
    one-process result, and each half matches the reference's partial; rank_shape: at the launch shape a rank
    takes (`moe_comm.rank_moe_config`: m = 40 the wide kernel's 32-token tiles, 200 its 128-row tiles)."""
    from dsv4.distributed.moe_comm import rank_moe_config
    from dsv4.kernels.moe import ExpertWeights, finalize_experts, fused_moe, fused_moe_ref

    e, d, i, k = 16, 512, 256, 6
    gen = torch.Generator(DEV).manual_seed(m + 41)
    experts = _mxfp4_experts(e, d, i, gen)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _topk(m, e, k, gen)
    total = torch.zeros(m, d, device=DEV)
    for half in range(2):
        lo = half * (e // 2)
        part = ExpertWeights("mxfp4", *(getattr(experts, f)[lo:lo + e // 2] for f in
                                        ("w1", "w1_scale", "w2", "w2_scale", "w3", "w3_scale")))
        local = ids - lo
        local = torch.where((local >= 0) & (local < e // 2), local, -1)
        poison()
        cfg = rank_moe_config(m * k, e // 2, e) if rank_shape else _configs()["gemv"] if m == 9 else None
        y = fused_moe(x, local, w, finalize_experts(part), out_dtype=torch.float32, config=cfg)
        assert y.dtype == torch.float32
        close_bf16(y, fused_moe_ref(x, local, w, part, out_dtype=torch.float32), rel=1e-2, what=f"half {half}")
        total += y
    close_bf16(total.to(torch.bfloat16), fused_moe_ref(x, ids, w, experts), rel=1e-2, what=f"sum m={m}")


def test_swiglu_clamp_is_exercised():
    """The test weights must push gate/up past the limit, or the clamp would go untested."""
    from dsv4.kernels.moe import _expert_weight_f32, _linear_ref

    gen = torch.Generator(DEV).manual_seed(1)
    ex = _mxfp4_experts(2, 512, 256, gen)
    x = (torch.randn(64, 512, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    up = _linear_ref(x, _expert_weight_f32(ex.w3[0], ex.w3_scale[0], "mxfp4"), "fp8").float()
    frac = float((up.abs() > 10).float().mean())
    assert 0.02 < frac < 0.9, frac


@pytest.mark.parametrize("m", [1, 37, 200])
@pytest.mark.parametrize("scale_dtype", ["float32", "e8m0"])
def test_fused_moe_fp8_experts(m, scale_dtype, poison, close_bf16):
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    e, d, i, k = 8, 512, 256, 6
    gen = torch.Generator(DEV).manual_seed(m + 99)
    experts = _fp8_experts(e, d, i, gen, scale_dtype)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 4).to(torch.bfloat16)
    ids, w = _topk(m, e, k, gen)
    ref = fused_moe_ref(x, ids, w, experts)
    for cfg in (None, _configs()["swap"]):
        poison()
        y = fused_moe(x, ids, w, packed, config=cfg)
        close_bf16(y, ref, rel=1e-2, what=f"fp8 experts m={m} swap={cfg is not None}")


@pytest.mark.parametrize("model", ["flash", "pro"])
def test_fused_moe_real_dims(model, poison, close_bf16):
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    e, d, i = (256, 4096, 2048) if model == "flash" else (384, 7168, 3072)
    e = 12  # only the experts a few tokens touch; D and I are the real ones
    gen = torch.Generator(DEV).manual_seed(len(model))
    experts = _mxfp4_experts(e, d, i, gen)
    packed = finalize_experts(experts)
    for m in (1, 3, 70):
        x = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
        ids, w = _topk(m, e, 6, gen)
        ref = fused_moe_ref(x, ids, w, experts)
        for cfg in (None, _configs()["gemv"]):
            poison()
            close_bf16(fused_moe(x, ids, w, packed, config=cfg), ref, rel=1e-2, what=f"{model} m={m} {cfg}")


@pytest.mark.parametrize("model", ["flash", "pro"])
def test_fp8_down_is_the_default_from_its_threshold(model, poison, close_bf16, monkeypatch):
    """`fused_moe`'s prefill path runs the down GEMM on FP8 MMAs (moe_wide.FP8_DOWN) from
    FP8_DOWN_MIN_PAIRS_PER_EXPERT pairs per expert: at the threshold (real D and I) the default is a different
    computation from the bf16 down GEMM (not bit-identical) and matches the reference; one token below it the
    default is the bf16 down GEMM's bits."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Gluon kernels do not run in the interpreter")
    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe import finalize_experts, fused_moe, fused_moe_ref

    e, k = 8, 6
    d, i = (4096, 2048) if model == "flash" else (7168, 3072)
    gen = torch.Generator(DEV).manual_seed(7 + len(model))
    experts = _mxfp4_experts(e, d, i, gen)
    packed = finalize_experts(experts)
    at = -(-moe_wide.FP8_DOWN_MIN_PAIRS_PER_EXPERT * e // k)  # tokens whose pairs reach the threshold
    for m, fp8 in ((at, True), (at - 1, False)):
        x = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
        ids, w = _topk(m, e, k, gen)
        assert moe_wide.fp8_down_path(packed, x.device, ids.numel()) is fp8
        poison()
        got = fused_moe(x, ids, w, packed, out_dtype=torch.float32)
        with monkeypatch.context() as mp:
            mp.setattr(moe_wide, "FP8_DOWN", False)
            bf16 = fused_moe(x, ids, w, packed, out_dtype=torch.float32)
        if fp8:
            assert float((got == bf16).double().mean()) < 0.99
            close_bf16(got, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2,
                       what=f"{model} FP8 down m={m}")
        else:
            assert torch.equal(got, bf16)


def test_finalize_rejects_bad_scales():
    from dsv4.kernels.moe import finalize_experts

    gen = torch.Generator(DEV).manual_seed(2)
    ex = _mxfp4_experts(2, 256, 128, gen)
    ex.w2_scale[1, 3, 0] = 255
    with pytest.raises(ValueError, match="w2_scale"):
        finalize_experts(ex)
