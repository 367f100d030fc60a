"""moe_gemv.SCALE_WORDS (the "mma" GEMVs' E8M0 scale bytes read as 32-bit row words) against the byte loads. Small
enough for Triton's interpreter (in the Makefile's KERNEL_TESTS); the H200 runs it with tests/gpu."""
from __future__ import annotations

import os

import pytest
import torch
from test_moe_gemv_mma import LIMIT, _experts, _launch, _routing

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


@pytest.mark.parametrize("shape,per_program,split", [("bn64", 1, 1), ("bn64_u4_kd2", 1, 1), ("bn64_u1_s4", 1, 2),
                                                     ("bn128_w8", 1, 1), ("bn128_u4_kd4", 1, 1), ("bn64", 2, 1),
                                                     ("bn128_w8", 4, 1)])
def test_scale_words_same_bits(shape, per_program, split, poison, monkeypatch):
    """moe_gemv.SCALE_WORDS reads each row's E8M0 bytes of a loop step as 32-bit words and splits them by shifts:
    the same scales, so the same outputs as the byte loads for every pair of this rank (both GEMVs, unroll 1 / 2 / 4,
    split K, pairs per program), with scale bytes over the whole range the layout admits. The same bits in the
    interpreter; on the H200 the compiled row sums may flip a last bit (bench/probe_scale_words.py, s33e: 0.005 % of
    a Flash call's outputs, in the down GEMV), so at most 0.1 % of outputs may differ, by one bf16 ulp."""
    from dsv4.kernels import moe_gemv as mg
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_layout import WIDE_MAX_SCALE_BYTE

    e, d, i, k, m = 8, 512, 256, 6, 5 if DEV == "cuda" else 3  # (the interpreter: 18 pairs, for its time)
    gen = torch.Generator(DEV).manual_seed(len(shape) * 3 + per_program + split)
    experts = _experts(e, d, i, gen)
    for s in (experts.w1_scale, experts.w3_scale, experts.w2_scale):  # every byte position a different value
        s.copy_(torch.randint(100, min(WIDE_MAX_SCALE_BYTE, 140), s.shape, generator=gen, device=DEV,
                              dtype=torch.uint8).view(s.dtype))
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    mine = (ids.reshape(-1) >= 0).nonzero()[:, 0]
    run = dict(_launch(shape), method="mma", pairs_per_program=per_program, split=split, split_down=split)
    s13, s2 = packed.w13_scale.view(torch.uint8), packed.w2_scale.view(torch.uint8)
    monkeypatch.setattr(mg, "SCALE_WORDS", False)
    assert not mg._scale_words(s13, per_program)
    poison()
    want = mg.moe_gemv(x, ids, w, packed, LIMIT, **run)[mine]
    monkeypatch.setattr(mg, "SCALE_WORDS", True)
    monkeypatch.setattr(mg, "SCALE_WORDS_MIN_PAIRS", 1)  # every launch shape takes the words here
    assert mg._scale_words(s13, 1) and mg._scale_words(s2, 1)
    poison()
    got = mg.moe_gemv(x, ids, w, packed, LIMIT, **run)[mine]
    differ = got != want  # (the interpreter: none; on the H200 a rare last bit of a row sum, s33e)
    assert float(differ.double().mean()) <= 1e-3, f"{shape}: {int(differ.sum())} of {differ.numel()} outputs differ"
    a, b = got[differ].float(), want[differ].float()  # a wrong scale byte moves an output by many ulps
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(a.abs(), b.abs()))) - 7)
    assert bool(((a - b).abs() <= ulp).all()), f"{shape}: outputs differ by more than one bf16 ulp"


def test_scale_words_rule(monkeypatch):
    """The words where measured faster (fused_moe's blocks of two or more pairs per program, s33c-f), the bytes for
    one pair per program (M = 1, split K, was 12 % slower with words, s33e), and the bytes wherever a row start is
    not 4-byte aligned."""
    from dsv4.kernels import moe_gemv as mg

    s = torch.randint(100, 130, (3, 8, 16), dtype=torch.uint8, device=DEV)
    assert mg.SCALE_WORDS and not mg._scale_words(s, 1) and mg._scale_words(s, 2) and mg._scale_words(s, 4)
    assert not mg._scale_words(s[:, :, 1:], 2), "rows starting at an odd byte"
    assert not mg._scale_words(torch.randint(100, 130, (3, 8, 18), dtype=torch.uint8, device=DEV)[..., :16], 2)
    monkeypatch.setattr(mg, "SCALE_WORDS", False)
    assert not mg._scale_words(s, 4)
