"""Fused attention-input glue (dsv4.kernels.norm_rope) vs its torch reference, which is the model's own
path (RMSNorm, per-head bf16 norm, RoPE, FP8 / Hadamard+FP4 simulation): every case of the model,
fresh random inputs over several binades, outputs poisoned with NaN first."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
INTERP = os.environ.get("TRITON_INTERPRET") == "1"  # the CPU interpreter truncates fp32 -> bf16

CASES = {  # name: (shape, kwargs builder)
    "q_latent": ((5, 1024), "weighted"),
    "q_heads": ((3, 64, 512), "unweighted"),
    "kv": ((7, 512), "kv"),
    "index_q": ((4, 64, 128), "index"),
    "index_q_tail": ((5, 20, 128), "index"),  # 100 rows: a partial block of HADAMARD_ROWS
    "output": ((6, 64, 512), "inverse"),
    # ROWS_PER_PROGRAM rows per program from ROWS_FROM rows on (prefill sizes), with a partial last block
    "q_heads_prefill": ((37, 64, 512), "unweighted"),
    "output_prefill": ((37, 64, 512), "inverse"),
    "kv_prefill": ((2051, 512), "kv"),
    "q_latent_prefill": ((2049, 1024), "weighted"),
    # widths that are not powers of two (the tile is padded): Pro's q latent (1536), RoPE on a 192-wide head
    "q_latent_pro": ((5, 1536), "weighted"),
    "q_latent_pro_prefill": ((2049, 1536), "weighted"),
    "q_heads_192": ((3, 4, 192), "unweighted"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_norm_rope_matches_model_path(case, monkeypatch):
    from dsv4.config import Rope, Yarn
    from dsv4.kernels import norm_rope as nr
    from dsv4.model.rope import RotaryEmbedding

    shape, kind = CASES[case]
    g = torch.Generator(device=DEV).manual_seed(len(case))
    scale = torch.exp2(torch.randint(-4, 5, (shape[0],) + (1,) * (len(shape) - 1), generator=g, device=DEV).float())
    x = (torch.randn(shape, generator=g, device=DEV) * scale).to(torch.bfloat16)
    d = shape[-1]
    rope = RotaryEmbedding(64, Rope(theta=160000.0, yarn=Yarn(16.0, 65536, 32.0, 1.0)))
    cos, sin = rope.cos_sin(torch.randint(0, 100000, (shape[0],), generator=g, device=DEV))
    weight = (1 + 0.3 * torch.randn(d, generator=g, device=DEV)).to(torch.bfloat16)
    kw = {"weighted": dict(norm=nr.WEIGHTED, weight=weight, eps=1e-6),
          "unweighted": dict(norm=nr.UNWEIGHTED, eps=1e-6, cos=cos, sin=sin),
          "kv": dict(norm=nr.WEIGHTED, weight=weight, eps=1e-6, cos=cos, sin=sin, sim=nr.SIM_FP8, nope=448),
          "index": dict(cos=cos, sin=sin, sim=nr.SIM_FP4),
          "inverse": dict(cos=cos, sin=sin, inverse=True)}[kind]
    want = nr.norm_rope_ref(x, **kw)
    real_empty = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **k: real_empty(t, **k).fill_(float("nan")))  # poison
    got = nr.norm_rope(x, **kw)
    assert got.shape == want.shape and got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    differ = float((got != want).double().mean())
    rel = float((got.double() - want.double()).norm() / want.double().norm())
    print(f"{case}: {differ:.2e} of elements differ, rel {rel:.2e}")
    # fp32 sums in another order: bf16 results differ only at rounding ties (FP4/FP8 steps amplify those)
    assert rel < (0.1 if INTERP else 2e-2) and differ < (0.7 if INTERP else 0.02), (differ, rel)


@pytest.mark.parametrize("rows,warps", [(32, 4), (64, 8), (128, 8)])
def test_index_q_launch_shapes_give_the_same_bits(rows, warps, monkeypatch):
    """The indexer q glue (SIM_FP4) on other rows per program / warps (nr.HADAMARD_ROWS / HADAMARD_WARPS): the
    default launch's bits (each row's math is its own: the Hadamard dot sums one row's products, the FP4 blocks
    are within a row), partial last blocks included."""
    from dsv4.kernels import norm_rope as nr

    g = torch.Generator(device=DEV).manual_seed(rows + warps)
    x = (torch.randn(41, 64, 128, generator=g, device=DEV) * 3).to(torch.bfloat16)
    theta = torch.rand(41, 32, generator=g, device=DEV) * 6.3
    kw = dict(cos=torch.cos(theta), sin=torch.sin(theta), sim=nr.SIM_FP4)
    want = nr.norm_rope(x, **kw)
    monkeypatch.setattr(nr, "HADAMARD_ROWS", rows)
    monkeypatch.setattr(nr, "HADAMARD_WARPS", warps)
    got = nr.norm_rope(x, **kw)
    assert torch.equal(got, want), f"{(got != want).sum().item()} elements differ"
    assert not torch.equal(got, x)


def test_norm_rope_refuses_widths_its_simulations_cannot_tile():
    from dsv4.kernels import norm_rope as nr
    x = torch.randn(3, 96, device=DEV).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"norm_rope: .*\(3, 96\), sim=2"):
        nr.norm_rope(x, sim=nr.SIM_FP4)
    with pytest.raises(ValueError, match=r"norm_rope: .*\(3, 96\), sim=1"):
        nr.norm_rope(x, sim=nr.SIM_FP8, nope=64)


@pytest.mark.parametrize("rows,da", [(3, 1024), (2051, 1024), (5, 1536)])
def test_norm_rope_two_q_latent_and_kv(rows, da, monkeypatch):
    """`norm_rope_two` with the q latent's weighted norm and the window kv's norm + RoPE + FP8 simulation (one
    launch, 8 warps for both): each output as its own `norm_rope` call gives it, up to rare last-bit flips of a
    row's sum of squares, and both against the model path; decode and prefill row counts, Pro's width."""
    from dsv4.kernels import norm_rope as nr

    g = torch.Generator(device=DEV).manual_seed(rows + da)
    scale = torch.exp2(torch.randint(-4, 5, (rows, 1), generator=g, device=DEV).float())
    a = (torch.randn(rows, da, generator=g, device=DEV) * scale).to(torch.bfloat16)
    b = (torch.randn(rows, 512, generator=g, device=DEV) * scale.flip(0)).to(torch.bfloat16)
    cos, sin = _cos_sin(rows, g)
    kw_a = dict(norm=nr.WEIGHTED, weight=(1 + 0.3 * torch.randn(da, generator=g, device=DEV)).to(torch.bfloat16),
                eps=1e-6)
    kw_b = dict(norm=nr.WEIGHTED, weight=(1 + 0.3 * torch.randn(512, generator=g, device=DEV)).to(torch.bfloat16),
                eps=1e-5, cos=cos, sin=sin, sim=nr.SIM_FP8, nope=448)
    one_a, one_b = nr.norm_rope(a, **kw_a), nr.norm_rope(b, **kw_b)
    _poison_empty_like(monkeypatch)
    got_a, got_b = nr.norm_rope_two(a, kw_a, b, kw_b)
    for got, one, want, what in ((got_a, one_a, nr.norm_rope_ref(a, **kw_a), "q latent"),
                                 (got_b, one_b, nr.norm_rope_ref(b, **kw_b), "kv")):
        assert got.shape == one.shape and torch.isfinite(got).all(), what
        same = float((got == one).double().mean())
        rel = float((got.double() - want.double()).norm() / want.double().norm())
        assert same > (0.95 if what == "kv" else 0.99), f"{what}: only {same:.4f} equal to its own call"
        assert rel < (0.1 if INTERP else 2e-2), f"{what}: rel {rel:.2e} against the model path"
    with pytest.raises(ValueError, match="norm_rope"):
        nr.norm_rope_two(a, kw_a, b[:, :96], kw_b)


@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_norm_rope_two_q_heads_and_indexer_q(tokens, monkeypatch):
    """`norm_rope_two` with the q heads' per-head norm + RoPE and the indexer q's RoPE + Hadamard + FP4 simulation
    (both 4 warps, each part with its own rows per program): the two calls' bits exactly."""
    from dsv4.kernels import norm_rope as nr

    g = torch.Generator(device=DEV).manual_seed(tokens)
    heads, idx_heads, hd = (64, 64, 512) if not INTERP else (8, 8, 256)
    q = (torch.randn(tokens, heads, hd, generator=g, device=DEV) * 3).to(torch.bfloat16)
    iq = torch.randn(tokens, idx_heads, 128, generator=g, device=DEV).to(torch.bfloat16)
    cos, sin = _cos_sin(tokens, g)
    kw_q = dict(norm=nr.UNWEIGHTED, eps=1e-6, cos=cos, sin=sin)
    kw_i = dict(cos=cos, sin=sin, sim=nr.SIM_FP4)
    one_q, one_i = nr.norm_rope(q, **kw_q), nr.norm_rope(iq, **kw_i)
    _poison_empty_like(monkeypatch)
    got_q, got_i = nr.norm_rope_two(q, kw_q, iq, kw_i)
    assert torch.equal(got_q, one_q) and torch.equal(got_i, one_i)


def _cos_sin(tokens: int, g: torch.Generator):
    from dsv4.config import Rope
    from dsv4.model.rope import RotaryEmbedding
    return RotaryEmbedding(64, Rope(theta=10000.0, yarn=None)).cos_sin(
        torch.randint(0, 100000, (tokens,), generator=g, device=DEV))


def _poison_empty_like(monkeypatch) -> None:
    real_empty = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **k: real_empty(t, **k).fill_(float("nan")))


@pytest.mark.parametrize("case", ["q_heads", "kv", "index_q", "q_heads_192"]
                         + (["output", "q_heads_prefill"] if DEV == "cuda" else []))
def test_rope_first_same_bits(case, monkeypatch):
    """norm_rope.ROPE_FIRST (one row per program: cos / sin loaded with the rows, before the norm) feeds the same
    values to the same arithmetic: bit-identical outputs, single launches and the paired one (prefill sizes: not
    applied)."""
    from dsv4.kernels import norm_rope as nr

    shape, kind = CASES[case]
    g = torch.Generator(device=DEV).manual_seed(len(case) + 7)
    x = (torch.randn(shape, generator=g, device=DEV) * 4).to(torch.bfloat16)
    cos, sin = _cos_sin(shape[0], g)
    weight = (1 + 0.3 * torch.randn(shape[-1], generator=g, device=DEV)).to(torch.bfloat16)
    kw = {"unweighted": dict(norm=nr.UNWEIGHTED, eps=1e-6, cos=cos, sin=sin),
          "kv": dict(norm=nr.WEIGHTED, weight=weight, eps=1e-6, cos=cos, sin=sin, sim=nr.SIM_FP8, nope=448),
          "index": dict(cos=cos, sin=sin, sim=nr.SIM_FP4),
          "inverse": dict(cos=cos, sin=sin, inverse=True)}[kind]
    other = (torch.randn(shape[0], 1024, generator=g, device=DEV)).to(torch.bfloat16)
    outs = []
    for first in (False, True):
        monkeypatch.setattr(nr, "ROPE_FIRST", first)
        _poison_empty_like(monkeypatch)
        outs.append((nr.norm_rope(x, **kw),) + nr.norm_rope_two(other, dict(norm=nr.UNWEIGHTED, eps=1e-6), x, kw))
    for a, b in zip(*outs):
        assert torch.isfinite(a.float()).all() and torch.equal(a, b), case


@pytest.mark.skipif(INTERP, reason="the interpreter truncates fp32 -> bf16")
@pytest.mark.parametrize("shape", [(1, 2, 128), (3, 64, 512), (37, 64, 512), (5, 512), (2051, 128)])
@pytest.mark.parametrize("inverse", [False, True])
def test_rotation_alone_has_the_reference_bits(shape, inverse, monkeypatch):
    """RoPE alone (no norm and no simulation: nothing is summed) rounds every product as torch does
    (dsv4.kernels._triton.rotate_pairs): the reference's bits exactly, at one row per program and at several,
    in both ROPE_FIRST orders."""
    from dsv4.kernels import norm_rope as nr

    g = torch.Generator(device=DEV).manual_seed(sum(shape) + inverse)
    x = (torch.randn(shape, generator=g, device=DEV) * 5).to(torch.bfloat16)
    cos, sin = _cos_sin(shape[0], g)
    want = nr.norm_rope_ref(x, cos=cos, sin=sin, inverse=inverse)
    for first in (False, True):
        monkeypatch.setattr(nr, "ROPE_FIRST", first)
        got = nr.norm_rope(x, cos=cos, sin=sin, inverse=inverse)
        assert torch.equal(got, want), f"{(got != want).sum().item()} of {got.numel()} differ (ROPE_FIRST={first})"
    assert not torch.equal(want, x)


@pytest.mark.parametrize("width", ["tiny", "flash"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_rope_first_same_bits_in_the_model_pairs(width, tokens, monkeypatch):
    """The attention input's two paired launches as the model makes them (q latent + window kv; q heads + indexer
    q) at the embedded model's and Flash's widths, in both ROPE_FIRST orders: the same bits. Session 44: at the
    embedded model's widths the compiled rotation folded the other product into its fma in one order (the graph
    test's logits moved with ROPE_FIRST) until the products were rounded explicitly."""
    from dsv4.kernels import norm_rope as nr

    if INTERP and width == "flash":
        pytest.skip("Flash widths: GPU only (slow in the interpreter; the orders compile only on the GPU)")
    latent, kv_dim, nope, heads, head_dim, index_heads = {"tiny": (128, 128, 64, 2, 128, 16),
                                                          "flash": (1024, 512, 448, 64, 512, 64)}[width]
    g = torch.Generator(device=DEV).manual_seed(tokens + latent)
    rand = lambda *s: (torch.randn(s, generator=g, device=DEV) * 3).to(torch.bfloat16)  # noqa: E731
    cos, sin = _cos_sin(tokens, g)
    weight = lambda d: (1 + 0.3 * torch.randn(d, generator=g, device=DEV)).to(torch.bfloat16)  # noqa: E731
    q_latent, kv, q, index_q = rand(tokens, latent), rand(tokens, kv_dim), rand(tokens, heads, head_dim), \
        rand(tokens, index_heads, 128)
    latent_kw = dict(norm=nr.WEIGHTED, weight=weight(latent), eps=1e-6)
    kv_kw = dict(norm=nr.WEIGHTED, weight=weight(kv_dim), eps=1e-6, cos=cos, sin=sin, sim=nr.SIM_FP8, nope=nope)
    q_kw, index_kw = dict(norm=nr.UNWEIGHTED, eps=1e-6, cos=cos, sin=sin), dict(cos=cos, sin=sin, sim=nr.SIM_FP4)
    outs = []
    for first in (False, True):
        monkeypatch.setattr(nr, "ROPE_FIRST", first)
        outs.append(nr.norm_rope_two(q_latent, latent_kw, kv, kv_kw) + nr.norm_rope_two(q, q_kw, index_q, index_kw)
                    + (nr.norm_rope(q, **q_kw),))
    for name, a, b in zip(("q latent", "kv", "q", "index q", "q alone"), *outs):
        assert torch.isfinite(a.float()).all() and torch.equal(a, b), name
