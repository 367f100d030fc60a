"""Kernel mode's fused projections of the attention input (`Attention.fused_input_weight` /
`_project_fused`, torch epilogue on CPU) against a float64 re-derivation of the separate linears
(spec §2.7 compressor rows, §2.8 indexer head weights) and against the separate modules themselves;
the stacked weight's bookkeeping: shared storage, reloads, replaced weights."""
from __future__ import annotations

import pytest
import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.model.attention import Attention
from dsv4.model.numerics import resolve_numerics

F64 = torch.float64


def _layer(kind: str, seed: int):
    cfg = tiny_config(layers=kind)
    attn = Attention(cfg, cfg.layer(0), torch.bfloat16, resolve_numerics("reference"))
    gen = torch.Generator().manual_seed(seed)
    _randomize(attn, gen)
    return cfg, attn, gen


def _randomize(attn: Attention, gen: torch.Generator) -> None:
    with torch.no_grad():
        for lin in attn.fused_linears():
            w = torch.randn(lin.weight.shape, generator=gen) * lin.in_features ** -0.5
            lin.weight.copy_(w.to(torch.bfloat16))
        for comp in (attn.compressor, attn.indexer and attn.indexer.compressor):
            if comp:
                comp.ape.copy_(torch.randn(comp.ape.shape, generator=gen))


def _f64_rows(comp, a: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """C = wkv a, Z = wgate a + ape[t mod r], exactly."""
    a64 = a.to(F64)
    c = a64 @ comp.wkv.weight.to(F64).T
    z = a64 @ comp.wgate.weight.to(F64).T + comp.ape.to(F64)[positions % comp.ratio]
    return c, z


def _check(attn: Attention, a: torch.Tensor, positions: torch.Tensor) -> None:
    rows, index_rows, index_w = attn._project_fused(a, positions)
    comps = [(attn.compressor, rows)] + ([(attn.indexer.compressor, index_rows)] if attn.indexer else [])
    for comp, got in comps:
        want64 = _f64_rows(comp, a, positions)
        sep = comp.project(a, positions)
        for part, g, w, s in zip("CZ", got, want64, sep):
            assert g.dtype == torch.float32 and g.shape == (a.shape[0], comp.wkv.out_features), part
            # fp32 sums of exact bf16 products: within a few fp32 ulps of the exact value
            assert torch.allclose(g.to(F64), w, rtol=0, atol=1e-5 * float(w.abs().max())), f"{comp.kind} {part}"
            assert torch.allclose(g, s, rtol=0, atol=1e-5 * float(s.abs().max())), f"{comp.kind} {part} vs module"
    if attn.indexer is None:
        assert index_rows is None and index_w is None
        return
    ind = attn.indexer
    sep = ind.weights_proj(a) * ind.weight_scale
    assert index_w.dtype == torch.bfloat16 and index_w.shape == (a.shape[0], ind.n_heads)
    exact = a.to(F64) @ ind.weights_proj.weight.to(F64).T
    # bf16(fp32 sum) then bf16(x * scale): two roundings of a value within fp32 ulps of `exact`
    assert torch.allclose(index_w.to(F64), exact * ind.weight_scale, rtol=2 ** -7, atol=0)
    steps = (index_w.view(torch.int16).int() - sep.view(torch.int16).int()).abs()
    assert int(steps.max()) <= 1 and float((steps > 0).float().mean()) < 0.05


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_fused_projection_matches_float64_and_separate_linears(kind):
    cfg, attn, gen = _layer(kind, seed=3 if kind == "csa" else 4)
    a = torch.randn(7, cfg.hidden_size, generator=gen).to(torch.bfloat16)
    positions = torch.tensor([0, 1, 5, 127, 128, 4099, 65538])
    _check(attn, a, positions)
    widths = [lin.out_features for lin in attn.fused_linears()]
    assert attn.fused_input_weight().shape == (sum(widths), cfg.hidden_size)
    expect = [2 * cfg.head_dim] * 2 if kind == "csa" else [cfg.head_dim] * 2
    if kind == "csa":
        expect += [2 * cfg.index_head_dim] * 2 + [cfg.index_n_heads]
    assert widths == expect


def test_stacked_weight_shares_storage_and_follows_reloads():
    cfg, attn, gen = _layer("csa", seed=5)
    a = torch.randn(4, cfg.hidden_size, generator=gen).to(torch.bfloat16)
    positions = torch.tensor([2, 3, 900, 901])
    stacked = attn.fused_input_weight()
    row = 0
    for lin in attn.fused_linears():  # each linear's weight is its row block of the stack
        assert lin.weight.data_ptr() == stacked[row].data_ptr()
        row += lin.out_features
    assert attn.fused_input_weight() is stacked  # built once
    # a reload copies into the weights in place (DeepseekV4ForCausalLM._copy): the stack follows
    _randomize(attn, gen)
    assert attn.fused_input_weight() is stacked
    _check(attn, a, positions)
    # a replaced weight (a new tensor, as .to() makes) is noticed: the stack is rebuilt from the new values
    wp = attn.indexer.weights_proj
    wp.weight.data = (torch.randn(wp.weight.shape, generator=gen) * 0.1).to(torch.bfloat16)
    rebuilt = attn.fused_input_weight()
    assert rebuilt is not stacked and torch.equal(rebuilt[-wp.out_features:], wp.weight)
    _check(attn, a, positions)
    # module conversions drop the stack; the next use stacks the converted weights
    attn._apply(lambda t: t.clone())
    assert attn._fused is None
    _check(attn, a, positions)


def test_kernel_mode_prepare_uses_one_fused_gemm(monkeypatch):
    """prepare in kernel mode hands on the fused rows/weights (the Triton glue stubbed by its references)."""
    from dsv4.kernels import norm_rope as nr

    cfg, attn, gen = _layer("csa", seed=6)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if not any(p is lin.weight for lin in attn.fused_linears()) and not name.endswith("ape"):
                scale = 1.0 if p.dim() == 1 else p.shape[-1] ** -0.5
                p.copy_((torch.randn(p.shape, generator=gen) * scale).to(p.dtype))
    a = torch.randn(3, cfg.hidden_size, generator=gen).to(torch.bfloat16)
    positions = torch.tensor([9, 10, 11])
    monkeypatch.setattr(nr, "norm_rope", nr.norm_rope_ref)
    monkeypatch.setattr(nr, "norm_rope_two", nr.norm_rope_two_ref)
    attn.use_kernels = attn.indexer.use_kernels = True
    pre = attn.prepare(a, positions)
    rows, index_rows, index_w = attn._project_fused(a, positions)
    for got, want in ((pre.rows, rows), (pre.index_rows, index_rows)):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert torch.equal(pre.index_w, index_w)
    # the four row tensors are column views of one GEMM output
    storage = pre.rows[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == storage for t in (*pre.rows, *pre.index_rows))
