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


def test_norm_rope_refuses_widths_its_simulations_cannot_tile():
    from dsv4.kernels import norm_rope as nr
    x = torch.randn(3, 96, device=DEV).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"norm_rope: .*\(3, 96\), sim=2"):
        nr.norm_rope(x, sim=nr.SIM_FP4)
    with pytest.raises(ValueError, match=r"norm_rope: .*\(3, 96\), sim=1"):
        nr.norm_rope(x, sim=nr.SIM_FP8, nope=64)


@pytest.mark.parametrize("rows,da", [(3, 1024), (2051, 1024), (5, 1536)])
def test_norm_rope_pair_gives_the_two_calls(rows, da, monkeypatch):
    """`norm_rope_pair` (the q latent's weighted norm and the window kv's norm + RoPE + FP8 simulation in one
    launch): each output as its own `norm_rope` call gives it, up to rare last-bit flips of a row's sum of squares
    (one launch shape for both), both against the model path too; decode and prefill row counts, Pro's width."""
    from dsv4.config import Rope, Yarn
    from dsv4.kernels import norm_rope as nr
    from dsv4.model.rope import RotaryEmbedding

    g = torch.Generator(device=DEV).manual_seed(rows + da)
    scale = torch.exp2(torch.randint(-4, 5, (rows, 1), generator=g, device=DEV).float())
    a = (torch.randn(rows, da, generator=g, device=DEV) * scale).to(torch.bfloat16)
    b = (torch.randn(rows, 512, generator=g, device=DEV) * scale.flip(0)).to(torch.bfloat16)
    wa = (1 + 0.3 * torch.randn(da, generator=g, device=DEV)).to(torch.bfloat16)
    wb = (1 + 0.3 * torch.randn(512, generator=g, device=DEV)).to(torch.bfloat16)
    rope = RotaryEmbedding(64, Rope(theta=10000.0, yarn=None))
    cos, sin = rope.cos_sin(torch.randint(0, 100000, (rows,), generator=g, device=DEV))
    kw_a = dict(norm=nr.WEIGHTED, weight=wa, eps=1e-6)
    kw_b = dict(norm=nr.WEIGHTED, weight=wb, eps=1e-5, cos=cos, sin=sin, sim=nr.SIM_FP8, nope=448)
    one_a, one_b = nr.norm_rope(a, **kw_a), nr.norm_rope(b, **kw_b)
    real_empty = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **k: real_empty(t, **k).fill_(float("nan")))  # poison
    got_a, got_b = nr.norm_rope_pair(a, wa, 1e-6, b, wb, 1e-5, cos, sin, sim=nr.SIM_FP8, nope=448)
    for got, one, want, what in ((got_a, one_a, nr.norm_rope_ref(a, **kw_a), "q latent"),
                                 (got_b, one_b, nr.norm_rope_ref(b, **kw_b), "kv")):
        assert got.shape == one.shape and torch.isfinite(got).all(), what
        same = float((got == one).double().mean())
        rel = float((got.double() - want.double()).norm() / want.double().norm())
        assert same > (0.95 if what == "kv" else 0.99), f"{what}: only {same:.4f} equal to its own call"
        assert rel < (0.1 if INTERP else 2e-2), f"{what}: rel {rel:.2e} against the model path"
    with pytest.raises(ValueError, match="norm_rope_pair"):
        nr.norm_rope_pair(a, wa, 1e-6, b[:, :96], wb, 1e-5, cos, sin)
