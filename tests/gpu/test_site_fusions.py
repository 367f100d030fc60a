"""A launch folded into the mHC sites (kernel mode, decode sizes), against the launches it replaces:
block.COMBINE_IN_NEXT_SITE -- the routed MoE's combine left to the next site (`moe_combine.PendingCombine`), whose
mix sums the rows as it loads the MoE output: the same bits (X', u, post, comb), one launch fewer; at the model level
the decode logits bit-identical with the launches counted fewer. Fresh random rows (bf16 rows and the persistent
down's fp32 partials), a slot of an expert held elsewhere, with and without the shared expert's row."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import dsv4
from dsv4 import load_model

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
KW = dict(sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6)
D = 4096 if DEV == "cuda" else 128
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paged_driver import PagedBatch  # noqa: E402


def _launches(monkeypatch) -> list:
    """Records every combine launch (`moe_combine._launch`)."""
    from dsv4.kernels import moe_combine

    seen, real = [], moe_combine._launch
    monkeypatch.setattr(moe_combine, "_launch", lambda p: seen.append(p.out.shape[0]) or real(p))
    return seen


def _site_inputs(t: int, ranges: int, shared: bool, gen: torch.Generator):
    """(combine arguments, the site's other inputs) over t tokens, 6 slots each, 8 experts."""
    top_k, experts = 6, 8
    ids = torch.randint(0, experts, (t, top_k), generator=gen, device=DEV, dtype=torch.int32)
    ids[0, 2] = experts + 3  # held by another rank: its row is never written, the combine skips it
    rows = torch.randn(*((ranges,) if ranges else ()), t * top_k, D, generator=gen, device=DEV)
    y = rows if ranges else rows.to(torch.bfloat16)
    if not ranges:
        y[2] = float("nan")  # the skipped slot's row (token 0, slot 2): must not be read
    sh = torch.randn(t, D, generator=gen, device=DEV).to(torch.bfloat16) if shared else None
    out = torch.empty(t, D, dtype=torch.bfloat16, device=DEV)
    mag = torch.exp2(torch.randint(-3, 4, (t, 4, 1), generator=gen, device=DEV).float())
    x = (torch.randn(t, 4, D, generator=gen, device=DEV) * mag).to(torch.bfloat16)
    post = torch.rand(t, 4, generator=gen, device=DEV) * 2
    comb = torch.softmax(torch.randn(t, 4, 4, generator=gen, device=DEV), -1)
    fn = torch.randn(24, 4 * D, generator=gen, device=DEV) * (2.0 / (4 * D) ** 0.5)
    base, scale = torch.randn(24, generator=gen, device=DEV) * 0.5, torch.rand(3, generator=gen, device=DEV) + 0.5
    w = (torch.rand(D, generator=gen, device=DEV) + 0.5).to(torch.bfloat16)
    return (y, sh, ids, out, experts), (x, post, comb, fn, base, scale, w)


@pytest.mark.parametrize("t", [1, 3, 20])
@pytest.mark.parametrize("ranges,shared", [(0, True), (2, True), (0, False), (3, False)])
def test_site_sums_the_pending_combine(t, ranges, shared, monkeypatch):
    """The site's mix sums the combine (no combine launch): X' / u / post / comb bit-identical to the combine's
    launch followed by the site, one token (the rows mix), three (the dot mix); twenty (the prefill tiles) launch it."""
    from dsv4.kernels import mhc
    from dsv4.kernels.moe_combine import PendingCombine, combine, deferred

    gen = torch.Generator(DEV).manual_seed(31 * t + 7 * ranges + shared)
    (y, sh, ids, out, experts), (x, post, comb, fn, base, scale, w) = _site_inputs(t, ranges, shared, gen)
    mix = mhc.prepare_mix(fn)
    launches = _launches(monkeypatch)
    want = mhc.hc_post_pre(combine(y, sh, ids, out.clone(), experts), x, post, comb, mix, base, scale, norm_weight=w,
                           **KW)
    assert launches == [t]
    with deferred():
        pending = combine(y, (lambda: sh) if shared else None, ids, out.clone(), experts)  # (a join: called now)
    assert isinstance(pending, PendingCombine) and launches == [t]
    got = mhc.hc_post_pre(pending, x, post, comb, mix, base, scale, norm_weight=w, **KW)
    assert launches == ([t] if t <= 16 else [t, t])  # prefill tiles launch the combine first
    for name, a, b in zip(("X'", "u", "post", "comb"), got, want):
        assert torch.isfinite(a).all() and torch.equal(a, b), f"{name} differs"
    # the last block's deferred combine, after the loop (`block.finish_carry`): launched, then the post
    assert torch.equal(mhc.hc_post(pending, x, post, comb), mhc.hc_post(want_f := pending.materialize(), x, post,
                                                                          comb))
    assert torch.equal(want_f, combine(y, sh, ids, out.clone(), experts))


def test_no_deferred_combine_when_the_moe_is_sharded(monkeypatch):
    """A sharded MoE (a layout: its ranks' partial sums are all-reduced after the combine) never defers; decode sizes
    do, prefill sizes do not."""
    from dsv4.model import block

    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cpu", torch.float32)
    layer = model.layers[1]
    monkeypatch.setattr(block, "COMBINE_IN_NEXT_SITE", True)
    assert layer.defers_combine(1) and layer.defers_combine(block.COMBINE_MAX_T)
    assert not layer.defers_combine(block.COMBINE_MAX_T + 1)
    monkeypatch.setattr(layer.ffn, "layout", object())
    assert not layer.defers_combine(1)
    monkeypatch.setattr(block, "COMBINE_IN_NEXT_SITE", False)
    monkeypatch.setattr(layer.ffn, "layout", None)
    assert not layer.defers_combine(1)


def _decode(monkeypatch, prompts: tuple, combine_in_site: bool):
    """(decode logits, combine launches, finish launches, the forwards' token counts, layers) of the embedded model,
    kernel mode, the decode steps of tests/paged_driver.py, COMBINE_IN_NEXT_SITE as given."""
    from dsv4.kernels import mhc
    from dsv4.model import block

    monkeypatch.setattr(block, "COMBINE_IN_NEXT_SITE", combine_in_site)
    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", DEV, torch.bfloat16, kernels="triton")
    batch = PagedBatch(model, "fp8", prompts=prompts, together=DEV != "cuda")  # (the interpreter: one prefill)
    combines, finishes, tokens, real, forward = _launches(monkeypatch), [], [], mhc._finish, batch.forward
    monkeypatch.setattr(mhc, "_finish", lambda *a: finishes.append(1) or real(*a))
    batch.forward = lambda seqs, ids, lens=None: tokens.append(ids.shape[0]) or forward(seqs, ids, lens)
    logits = torch.cat(batch.decode(12 if DEV == "cuda" else 1))
    monkeypatch.undo()
    return logits, len(combines), len(finishes), tokens, len(model.layers)


@pytest.mark.parametrize("prompts", [(9,), (9, 5)])
def test_model_decode_is_bit_identical(prompts, monkeypatch):
    """One sequence (one-token steps: the rows mix sums the combine), two (the dot mix). Every layer's MoE is combined
    by its own launch without the flag, the last layer's only with it (after the loop); a finish launch per site
    either way (the first layer's attention pre, then with the MoE's post fused into the next pre one per sub-layer,
    and the HC head)."""
    off, combines, finishes, tokens, layers = _decode(monkeypatch, prompts, False)
    sites = 2 * layers + 1
    assert (combines, finishes) == (len(tokens) * layers, len(tokens) * sites), (combines, finishes, tokens)
    on, combines, finishes, tokens, _ = _decode(monkeypatch, prompts, True)
    assert (combines, finishes) == (len(tokens), len(tokens) * sites), (combines, finishes, tokens)
    assert torch.isfinite(on).all() and torch.equal(on, off), f"max |diff| {float((on - off).abs().max()):.3e}"
