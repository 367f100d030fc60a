"""The Gluon prefill attention (dsv4.kernels.prefill_attention_gluon, `prefill_attention.GLUON`) vs the torch
reference, a float64 re-derivation of spec §2.5 and the Triton kernel, on fresh random inputs: partial windows,
several key tiles of window and of entries, -1 padded and unordered CSA lists, HCA's causal walk, fewer heads than
the kernel's 64 rows, a narrower head dim, the fused inverse RoPE. Gluon has no interpreter: GPU only."""

from __future__ import annotations

import os

import pytest
import torch

from test_prefill_attention import REL, _case, _float64, causal_case

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEV == "cpu" or not torch.cuda.is_available(), reason="Gluon kernels need a GPU")


@pytest.fixture(params=["pair", "scorer"])
def gluon(monkeypatch, request):
    """prefill_attention with GLUON on, counting the Gluon launches (so a test fails if it fell back); each test
    runs with both kernels: the warpgroups splitting every tile, or one scoring for both (`ONE_SCORER`)."""
    from dsv4.kernels import prefill_attention as pa
    from dsv4.kernels import prefill_attention_gluon as pg

    monkeypatch.setattr(pg, "ONE_SCORER", request.param != "pair")

    calls = []
    launch = pg.prefill_attention_gluon

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return launch(*args, **kwargs)

    monkeypatch.setattr(pg, "prefill_attention_gluon", counted)

    def run(*args, **kwargs):
        monkeypatch.setattr(pa, "GLUON", True)
        before = len(calls)
        y = pa.prefill_attention(*args, **kwargs)
        monkeypatch.setattr(pa, "GLUON", False)
        assert len(calls) == before + 1, "the Gluon kernel did not run"
        return y

    return run


@pytest.mark.parametrize("kind", ["csa", "hca", "none"])
@pytest.mark.parametrize("n,q_pos0,past,heads,hd", [(37, 200, 127, 64, 512), (20, 0, 0, 64, 512),
                                                    (70, 90, 90, 64, 512), (45, 300, 100, 12, 128)])
def test_gluon_matches_reference_and_triton(kind, n, q_pos0, past, heads, hd, gluon, poison, close_bf16,
                                            monkeypatch):
    import test_prefill_attention as tpa

    from dsv4.kernels.prefill_attention import prefill_attention, prefill_attention_ref

    monkeypatch.setattr(tpa, "HD", hd)
    gen = torch.Generator(DEV).manual_seed(n * 7 + q_pos0 + len(kind) + hd)
    q, keys, key_pos0, entries, idx, sink = _case(n, heads, q_pos0, past, 128, 150, kind, gen, topk=100)
    q = q * 2  # scores spread over a few units: the running maximum moves between tiles
    scale = hd ** -0.5
    ref = prefill_attention_ref(q, q_pos0, keys, key_pos0, 128, entries, idx, sink, scale)
    poison()
    y = gluon(q, q_pos0, keys, key_pos0, 128, entries, idx, sink, scale)
    close_bf16(y, ref, rel=REL, what=f"gluon {kind} n={n} heads={heads} hd={hd}")
    close_bf16(y, _float64(q, q_pos0, keys, key_pos0, 128, entries, idx, sink, scale), rel=max(REL, 5e-3),
               what=f"gluon vs float64 {kind}")
    triton_y = prefill_attention(q, q_pos0, keys, key_pos0, 128, entries, idx, sink, scale)
    close_bf16(y, triton_y, rel=REL, what=f"gluon vs triton {kind}")


@pytest.mark.parametrize("kind", ["csa", "none"])
def test_gluon_fuses_the_inverse_rope(kind, gluon, poison, close_bf16):
    """cos / sin: bit for bit the separate `norm_rope(inverse=True)` launch on the Gluon kernel's unrotated output."""
    from dsv4.kernels.norm_rope import norm_rope
    from dsv4.kernels.prefill_attention import prefill_attention_ref

    gen = torch.Generator(DEV).manual_seed(41 + len(kind))
    n, rope = 29, 64
    q, keys, key_pos0, entries, idx, sink = _case(n, 64, 150, 60, 128, 90, kind, gen, topk=70)
    theta = torch.rand(n, rope // 2, generator=gen, device=DEV) * 6.3
    cos, sin = torch.cos(theta), torch.sin(theta)
    scale = 512 ** -0.5
    plain = gluon(q, 150, keys, key_pos0, 128, entries, idx, sink, scale)
    poison()
    y = gluon(q, 150, keys, key_pos0, 128, entries, idx, sink, scale, cos, sin)
    two_launches = norm_rope(plain, cos=cos, sin=sin, inverse=True)
    assert torch.equal(y, two_launches), f"{(y != two_launches).sum().item()} elements differ"
    assert not torch.equal(y[..., -rope:], plain[..., -rope:])  # (the rotation did happen)
    assert torch.equal(y[..., :-rope], plain[..., :-rope])
    close_bf16(y, prefill_attention_ref(q, 150, keys, key_pos0, 128, entries, idx, sink, scale, cos, sin), rel=REL,
               what=f"gluon fused inverse RoPE {kind}")


@pytest.mark.parametrize("heads,hd,kind", [(64, 512, "csa"), (64, 512, "none"), (12, 128, "hca")])
def test_gluon_norms_q_in_shared_memory(heads, hd, kind, gluon, poison, close_bf16, monkeypatch):
    """q_norm = (eps, cos, sin): the kernel applies q's per-head norm + RoPE to Q in shared memory -- the bits of
    `norm_rope` then the kernel, up to the fp32 order of the norm's sum of squares (a head whose mean rounds the other
    way); padding heads (12 of 64) included."""
    import test_prefill_attention as tpa

    from dsv4.kernels.norm_rope import UNWEIGHTED, norm_rope

    monkeypatch.setattr(tpa, "HD", hd)
    gen = torch.Generator(DEV).manual_seed(heads + hd + len(kind))
    n, rope, eps = 53, 64, 1e-6
    q, keys, key_pos0, entries, idx, sink = _case(n, heads, 150, 60, 128, 90, kind, gen, topk=70)
    q = q * torch.exp(torch.randn(n, heads, 1, generator=gen, device=DEV) * 2).to(torch.bfloat16)  # head scales
    theta = torch.rand(n, rope // 2, generator=gen, device=DEV) * 6.3
    cos, sin = torch.cos(theta), torch.sin(theta)
    ocos, osin = torch.cos(theta * 0.5), torch.sin(theta * 0.5)  # the inverse RoPE's tables: other values
    want = gluon(norm_rope(q, norm=UNWEIGHTED, eps=eps, cos=cos, sin=sin), 150, keys, key_pos0, 128, entries, idx,
                 sink, hd ** -0.5, ocos, osin)
    poison()
    got = gluon(q, 150, keys, key_pos0, 128, entries, idx, sink, hd ** -0.5, ocos, osin, q_norm=(eps, cos, sin))
    differ = float((got != want).double().mean())
    print(f"q norm in the kernel vs norm_rope first: {differ:.2e} of the elements differ")
    assert differ < 0.02
    close_bf16(got, want, rel=REL, what=f"q norm in the kernel {kind} heads={heads} hd={hd}")


@pytest.mark.parametrize("n,q_pos0,past", [(37, 200, 127), (70, 0, 0), (20, 1000, 90)])
def test_gluon_causal_entries_equal_the_list(n, q_pos0, past, gluon, poison):
    """HCA's causal walk gives the bits of the explicit list of every complete entry."""
    ratio = 4
    q, keys, key_pos0, entries, idx, sink = causal_case(n, 64, q_pos0, past, ratio, 300,
                                                        torch.Generator(DEV).manual_seed(n + q_pos0 + 3))
    want = gluon(q, q_pos0, keys, key_pos0, 128, entries, idx, sink, 0.05)
    poison()
    got = gluon(q, q_pos0, keys, key_pos0, 128, entries, None, sink, 0.05, causal_ratio=ratio)
    assert torch.equal(got, want)


def test_gluon_supports_only_its_shapes():
    """More than 64 heads, a split head dim or explicit launch knobs keep the Triton kernel."""
    from dsv4.kernels.prefill_attention_gluon import supports

    q = torch.empty(3, 64, 512, device=DEV, dtype=torch.bfloat16)
    assert supports(q, None, None, None, None)
    assert not supports(torch.empty(3, 128, 512, device=DEV, dtype=torch.bfloat16), None, None, None, None)
    assert not supports(q, 256, None, None, None)
    assert not supports(q, None, 32, None, None)
    assert not supports(q.cpu(), None, None, None, None)
    from dsv4.kernels.prefill_attention_gluon import supports_q_norm
    assert supports_q_norm(512, 64) and supports_q_norm(128, 64)
    assert not supports_q_norm(512, 32) and not supports_q_norm(512, 96) and not supports_q_norm(64, 128)
