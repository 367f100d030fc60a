"""Prefill attention (dsv4.kernels.prefill_attention) vs its torch reference (the CPU model's
`sink_attention` on the same inputs) and a float64 re-derivation of spec §2.5; fresh random inputs,
partial windows, -1 padded entry lists (CSA top-k and HCA causal lists), poisoned outputs."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
# bf16 probabilities rounded at the running maximum (not the final one as in the reference): up to an
# ulp apart, on top of the bf16 output rounding; the CPU interpreter truncates fp32 -> bf16 as well
REL = 4e-3 if DEV != "cpu" else 1.5e-2
HD = 512 if DEV != "cpu" else 64  # the interpreter is slow: a narrow head there


@pytest.fixture(autouse=True)
def _triton_kernel(monkeypatch):
    """This module tests the Triton kernel; test_prefill_attention_gluon.py the Gluon one (`GLUON`)."""
    from dsv4.kernels import prefill_attention as pa

    monkeypatch.setattr(pa, "GLUON", False)


def _case(n, heads, q_pos0, past, window, n_entries, kind, gen, topk=16):
    """q, keys (the previous `past` window keys + the chunk's own), entries and entry lists."""
    q = (torch.randn(n, heads, HD, generator=gen, device=DEV) * 0.6).to(torch.bfloat16)
    keys = torch.randn(past + n, HD, generator=gen, device=DEV).to(torch.bfloat16)
    sink = torch.randn(heads, generator=gen, device=DEV)
    entries = idx = None
    if kind != "none":
        entries = torch.randn(n_entries, HD, generator=gen, device=DEV).to(torch.bfloat16)
        pos = torch.arange(q_pos0, q_pos0 + n, device=DEV)
        if kind == "csa":  # a random top-k of the visible entries per query, -1 padded, any order
            ratio, k = 4, min(topk, n_entries)
            visible = ((pos + 1) // ratio).clamp(max=n_entries)
            score = torch.rand(n, n_entries, generator=gen, device=DEV)
            score = score.masked_fill(torch.arange(n_entries, device=DEV)[None] >= visible[:, None], -1.0)
            top = score.topk(k, dim=1)
            idx = torch.where(top.values >= 0, top.indices, -1)
        else:  # HCA: every complete entry, in order
            visible = ((pos + 1) // 128).clamp(max=n_entries)
            ar = torch.arange(n_entries, device=DEV)[None].expand(n, -1)
            idx = torch.where(ar < visible[:, None], ar, -1)
    return q, keys, q_pos0 - past, entries, idx, sink


def causal_case(n, heads, q_pos0, past, ratio, max_entries, gen):
    """An HCA-style case whose entry list is every complete entry at `ratio` (fewer entries than the ratio implies
    when the chunk's entries so far are fewer): (q, keys, key_pos0, entries, the explicit list, sink)."""
    q, keys, key_pos0, entries, _, sink = _case(n, heads, q_pos0, past, 128, max_entries, "hca", gen)
    entries = entries[:min(entries.shape[0], (q_pos0 + n) // ratio)]
    pos = torch.arange(q_pos0, q_pos0 + n, device=DEV)
    every = torch.arange(entries.shape[0], device=DEV)[None, :]
    return q, keys, key_pos0, entries, torch.where(every < ((pos + 1) // ratio)[:, None], every, -1), sink


def _float64(q, q_pos0, keys, key_pos0, window, entries, idx, sink, scale):
    """Spec §2.5 directly, per query, in float64 (bf16 probabilities not simulated)."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for i in range(q.shape[0]):
        t = q_pos0 + i
        lo = max(t - window + 1, key_pos0, 0) - key_pos0
        cand = keys[lo:t - key_pos0 + 1].double()
        if entries is not None:
            sel = idx[i][idx[i] >= 0].long()
            cand = torch.cat((cand, entries[sel].double()))
        s = q[i].double() @ cand.T * scale
        peak = s.amax(dim=1, keepdim=True)
        p = torch.exp(s - peak)
        out[i] = (p @ cand) / (p.sum(1, keepdim=True) + torch.exp(sink.double()[:, None] - peak))
    return out


@pytest.mark.parametrize("kind", ["csa", "hca", "none"])
@pytest.mark.parametrize("n,q_pos0,past", [(37, 200, 127), (20, 0, 0), (70, 90, 90)])
@pytest.mark.parametrize("one_load", [False, True])
def test_prefill_attention_matches_reference(kind, n, q_pos0, past, one_load, poison, close_bf16, monkeypatch):
    """one_load: the value tile taken from the key tile (prefill_attention.KV_ONE_LOAD, whole head dim)."""
    from dsv4.kernels import prefill_attention as pa
    from dsv4.kernels.prefill_attention import prefill_attention, prefill_attention_ref

    monkeypatch.setattr(pa, "KV_ONE_LOAD", one_load)

    gen = torch.Generator(DEV).manual_seed(n * 31 + q_pos0 + len(kind))
    window, heads = 128, 64 if DEV != "cpu" else 16
    q, keys, key_pos0, entries, idx, sink = _case(n, heads, q_pos0, past, window, 80, kind, gen)
    scale = HD ** -0.5
    ref = prefill_attention_ref(q, q_pos0, keys, key_pos0, window, entries, idx, sink, scale)
    for dv in (None, HD // 2):  # one program per query (the default for 64 heads) and the split head dim
        poison()
        y = prefill_attention(q, q_pos0, keys, key_pos0, window, entries, idx, sink, scale, dv=dv)
        close_bf16(y, ref, rel=REL, what=f"prefill attention {kind} n={n} dv={dv}")
    exact = _float64(q, q_pos0, keys, key_pos0, window, entries, idx, sink, scale)
    close_bf16(y, exact, rel=max(REL, 5e-3), what=f"vs float64 {kind} n={n}")


def test_prefill_attention_pro_heads_and_short_window(poison, close_bf16):
    """128 heads (Pro), a window shorter than the chunk, entry lists longer than one key tile."""
    from dsv4.kernels.prefill_attention import prefill_attention, prefill_attention_ref

    gen = torch.Generator(DEV).manual_seed(5)
    heads = 128 if DEV != "cpu" else 32
    q, keys, key_pos0, entries, idx, sink = _case(50, heads, 300, 40, 24, 120, "csa", gen, topk=70)
    ref = prefill_attention_ref(q, 300, keys, key_pos0, 24, entries, idx, sink, 0.05)
    poison()
    y = prefill_attention(q, 300, keys, key_pos0, 24, entries, idx, sink, 0.05)
    close_bf16(y, ref, rel=REL, what="pro heads")


@pytest.mark.parametrize("kind", ["csa", "none"])
def test_prefill_attention_fuses_the_inverse_rope(kind, poison, close_bf16):
    """cos / sin given: the output's rope pairs rotated back in the kernel, bit for bit what the separate
    `norm_rope(inverse=True)` launch gives on the unrotated output (whole head dim and split per program), and
    close to the reference's own inverse RoPE."""
    from dsv4.kernels.norm_rope import norm_rope
    from dsv4.kernels.prefill_attention import prefill_attention, prefill_attention_ref

    gen = torch.Generator(DEV).manual_seed(17 + len(kind))
    n, heads, rope = 29, 64 if DEV != "cpu" else 16, 64 if DEV != "cpu" else 16
    q, keys, key_pos0, entries, idx, sink = _case(n, heads, 150, 60, 128, 50, kind, gen)
    theta = torch.rand(n, rope // 2, generator=gen, device=DEV) * 6.3
    cos, sin = torch.cos(theta), torch.sin(theta)
    scale = HD ** -0.5
    ref = prefill_attention_ref(q, 150, keys, key_pos0, 128, entries, idx, sink, scale, cos, sin)
    for dv in (None, HD // 2):
        plain = prefill_attention(q, 150, keys, key_pos0, 128, entries, idx, sink, scale, dv=dv)
        poison()
        y = prefill_attention(q, 150, keys, key_pos0, 128, entries, idx, sink, scale, cos, sin, dv=dv)
        two_launches = norm_rope(plain, cos=cos, sin=sin, inverse=True)
        assert torch.equal(y, two_launches), f"dv={dv}: {(y != two_launches).sum().item()} elements differ"
        assert not torch.equal(y[..., -rope:], plain[..., -rope:])  # (the rotation did happen)
        torch.testing.assert_close(y[..., :-rope], plain[..., :-rope], rtol=0, atol=0)
        close_bf16(y, ref, rel=REL, what=f"fused inverse RoPE {kind} dv={dv}")


def test_prefill_attention_q_norm_is_norm_rope_first(poison):
    """q_norm = (eps, cos, sin) on the Triton kernel: `norm_rope`'s per-head norm + RoPE of q first, the same bits;
    mismatched tables are refused."""
    from dsv4.kernels.norm_rope import UNWEIGHTED, norm_rope
    from dsv4.kernels.prefill_attention import prefill_attention

    gen = torch.Generator(DEV).manual_seed(23)
    n, heads, rope = 21, 8, 16 if DEV == "cpu" else 64
    q, keys, key_pos0, entries, idx, sink = _case(n, heads, 90, 40, 128, 30, "csa", gen)
    theta = torch.rand(n, rope // 2, generator=gen, device=DEV) * 6.3
    cos, sin = torch.cos(theta), torch.sin(theta)
    want = prefill_attention(norm_rope(q, norm=UNWEIGHTED, eps=1e-6, cos=cos, sin=sin), 90, keys, key_pos0, 128,
                             entries, idx, sink, 0.1)
    poison()
    got = prefill_attention(q, 90, keys, key_pos0, 128, entries, idx, sink, 0.1, q_norm=(1e-6, cos, sin))
    assert torch.equal(got, want)
    assert not torch.equal(got, prefill_attention(q, 90, keys, key_pos0, 128, entries, idx, sink, 0.1))
    with pytest.raises(ValueError, match="q_norm"):
        prefill_attention(q, 90, keys, key_pos0, 128, entries, idx, sink, 0.1, q_norm=(1e-6, cos[1:], sin[1:]))


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_prefill_attention_unmasked_loads_give_the_masked_bits(kind, monkeypatch, poison, close_bf16):
    """UNMASKED_LOADS (default) gives the masked loads' bits exactly: padding rows are read from a valid row, their
    scores -inf either way; the masked result is as close to the reference as the other tests ask."""
    from dsv4.kernels import prefill_attention as pa

    gen = torch.Generator(DEV).manual_seed(23 + len(kind))
    heads = 64 if DEV != "cpu" else 16
    q, keys, key_pos0, entries, idx, sink = _case(45, heads, 260, 100, 128, 90, kind, gen, topk=70)
    q = q * 3  # scores spread over several units: the running maximum moves
    scale = HD ** -0.5
    ref = pa.prefill_attention_ref(q, 260, keys, key_pos0, 128, entries, idx, sink, scale)
    monkeypatch.setattr(pa, "UNMASKED_LOADS", False)
    base = pa.prefill_attention(q, 260, keys, key_pos0, 128, entries, idx, sink, scale)
    close_bf16(base, ref, rel=REL, what=f"masked loads {kind}")
    monkeypatch.setattr(pa, "UNMASKED_LOADS", True)
    poison()
    assert torch.equal(pa.prefill_attention(q, 260, keys, key_pos0, 128, entries, idx, sink, scale), base)


@pytest.mark.parametrize("n,q_pos0,past", [(37, 200, 127), (70, 0, 0), (20, 1000, 90)])
def test_prefill_attention_causal_entries_equal_the_list(n, q_pos0, past, poison):
    """`causal_ratio` (HCA: the kernel walks every complete entry itself) gives the bits of the explicit list of
    every complete entry, with fewer entries than the ratio implies too (a chunk's entries so far)."""
    from dsv4.kernels.prefill_attention import prefill_attention

    ratio = 8
    q, keys, key_pos0, entries, idx, sink = causal_case(n, 64 if DEV != "cpu" else 16, q_pos0, past, ratio, 90,
                                                        torch.Generator(DEV).manual_seed(n + q_pos0))
    want = prefill_attention(q, q_pos0, keys, key_pos0, 128, entries, idx, sink, 0.05)
    poison()
    got = prefill_attention(q, q_pos0, keys, key_pos0, 128, entries, None, sink, 0.05, causal_ratio=ratio)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="causal_ratio"):
        prefill_attention(q, q_pos0, keys, key_pos0, 128, entries, idx, sink, 0.05, causal_ratio=ratio)


def test_prefill_attention_rejects_bad_inputs():
    from dsv4.kernels.prefill_attention import prefill_attention

    q = torch.randn(4, 16, HD, device=DEV).to(torch.bfloat16)
    keys = torch.randn(4, HD, device=DEV).to(torch.bfloat16)
    sink = torch.zeros(16, device=DEV)
    with pytest.raises(ValueError, match="must hold"):
        prefill_attention(q, 10, keys, 0, 128, None, None, sink, 1.0)
    with pytest.raises(ValueError, match="bf16"):
        prefill_attention(q.float(), 0, keys, 0, 128, None, None, sink, 1.0)
    cos = torch.ones(4, 8, device=DEV)
    with pytest.raises(ValueError, match="cos / sin"):
        prefill_attention(q, 0, keys, 0, 128, None, None, sink, 1.0, cos, None)
    with pytest.raises(ValueError, match="cos / sin"):
        prefill_attention(q, 0, keys, 0, 128, None, None, sink, 1.0, cos[:3], cos[:3])
