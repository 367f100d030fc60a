"""Fused projection epilogue (dsv4.kernels.projections) vs its torch reference and a float64
re-derivation; kernel-mode `Attention.prepare` (one fused GEMM) vs the torch path; and decode
attention without output rotation / with `out=` vs the identity rotation it replaces. Fresh random
inputs, poisoned outputs."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
CPU_INTERP = DEV == "cpu"  # Triton's interpreter truncates fp32 -> bf16 (1 ulp) instead of rounding


def _bf16_ulps(x: torch.Tensor, ref: torch.Tensor) -> int:
    """Largest distance in bf16 steps between two bf16 tensors of one sign pattern."""
    a, b = x.view(torch.int16).int(), ref.view(torch.int16).int()
    return int((a - b).abs().max()) if x.numel() else 0


# (tokens, gates as (column, ratio, width), head weights (column, heads) or None, total columns)
CASES = [
    (5, [(1024, 4, 1024), (2304, 4, 256)], (2560, 64), 2624),   # CSA: main | index | weights_proj
    (3, [(512, 128, 512)], None, 1024),                          # HCA: main compressor only
    (1, [(96, 4, 48), (200, 4, 40)], (240, 12), 260),            # odd widths: masked column blocks
]
if not CPU_INTERP:
    CASES.append((257, [(1024, 4, 1024), (2304, 4, 256)], (2560, 64), 2624))


@pytest.mark.parametrize("tokens,gates,head,n_cols", CASES)
def test_finish_projections_matches_reference(tokens, gates, head, n_cols, poison):
    from dsv4.kernels.projections import finish_projections, finish_projections_ref

    gen = torch.Generator(DEV).manual_seed(tokens * 7 + n_cols)
    y = torch.randn(tokens, n_cols, generator=gen, device=DEV) * 3
    positions = torch.randint(0, 1 << 20, (tokens,), generator=gen, device=DEV)
    g = [(col, torch.randn(r, w, generator=gen, device=DEV)) for col, r, w in gates]
    scale = 128 ** -0.5 * 64 ** -0.5
    hw = None if head is None else (head[0], head[1], scale)
    y_ref = y.clone()
    w_ref = finish_projections_ref(y_ref, positions, g, hw)
    y_k = y.clone()
    poison()
    w_k = finish_projections(y_k, positions, g, hw)
    assert torch.equal(y_k, y_ref), "gate columns (fp32 adds) differ from the reference"
    # float64 re-derivation of the gate columns (the fp32 add rounds once)
    want = y.double()
    for col, ape in g:
        want[:, col:col + ape.shape[1]] += ape.double()[positions.long() % ape.shape[0]]
    assert torch.allclose(y_k.double(), want, rtol=2 ** -23, atol=1e-6)
    if hw is None:
        assert w_k is None and w_ref is None
        return
    assert w_k.dtype == torch.bfloat16 and w_k.shape == (tokens, head[1]) and w_k.is_contiguous()
    assert torch.isfinite(w_k).all(), "unwritten head weights"
    if CPU_INTERP:
        assert _bf16_ulps(w_k, w_ref) <= 2  # two truncations: bf16(y), then the product
    else:
        assert torch.equal(w_k, w_ref), "head weights not bit-identical to bf16(y) * scale"
    w64 = y[:, head[0]:head[0] + head[1]].to(torch.bfloat16).double() * scale
    assert torch.allclose(w_k.double(), w64, rtol=2 ** -6 if CPU_INTERP else 2 ** -8, atol=0)


def test_finish_projections_rejects_bad_input():
    from dsv4.kernels.projections import finish_projections

    y = torch.randn(2, 64, device=DEV)
    pos = torch.tensor([3, 9], device=DEV)
    with pytest.raises(ValueError, match="columns"):
        finish_projections(y, pos, [(40, torch.randn(4, 32, device=DEV))])
    with pytest.raises(ValueError, match="y must be fp32"):
        finish_projections(y.to(torch.bfloat16), pos, [])
    with pytest.raises(ValueError, match="positions"):
        finish_projections(y, pos[:1], [])


# --------------------------------------------------------------------------- kernel-mode prepare


def _layer(kind: str, seed: int):
    from dsv4.checkpoint.writer import tiny_config
    from dsv4.model.attention import Attention
    from dsv4.model.numerics import resolve_numerics

    cfg = tiny_config(layers=kind)
    with torch.device(DEV):
        attn = Attention(cfg, cfg.layer(0), torch.bfloat16, resolve_numerics("reference"))
    gen = torch.Generator(DEV).manual_seed(seed)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            scale = 1.0 if ("norm" in name or name.endswith("ape") or "sink" in name) else p.shape[-1] ** -0.5
            p.copy_((torch.randn(p.shape, generator=gen, device=DEV) * scale).to(p.dtype))
    return cfg, attn, gen


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_kernel_mode_prepare_matches_torch_path(kind, poison):
    cfg, attn, gen = _layer(kind, seed=11 if kind == "csa" else 12)
    t = 6
    a = torch.randn(t, cfg.hidden_size, generator=gen, device=DEV).to(torch.bfloat16)
    positions = torch.tensor([0, 3, 4, 130, 1023, 70001], device=DEV)
    ref = attn.prepare(a, positions)
    attn.use_kernels = True
    if attn.indexer:
        attn.indexer.use_kernels = True
    poison()
    got = attn.prepare(a, positions)
    pairs = [("rows", got.rows, ref.rows)]
    if kind == "csa":
        pairs.append(("index_rows", got.index_rows, ref.index_rows))
    else:
        assert got.index_rows is None and got.index_w is None
    for what, g, r in pairs:  # fp32 GEMM of bf16 products: summation order only
        for part, x, y in zip("cz", g, r):
            assert x.dtype == torch.float32 and x.shape == y.shape
            err = float((x.double() - y.double()).abs().max() / y.double().abs().max())
            assert err < 1e-5, f"{what}.{part}: {err:.2e}"
    if kind == "csa":
        assert got.index_w.dtype == torch.bfloat16 and got.index_w.shape == ref.index_w.shape
        if CPU_INTERP:
            assert _bf16_ulps(got.index_w, ref.index_w) <= 2
        else:  # a flip only where the two GEMMs' fp32 sums straddle a bf16 rounding boundary
            assert _bf16_ulps(got.index_w, ref.index_w) <= 1
            assert float((got.index_w != ref.index_w).float().mean()) < 0.05


# --------------------------------------------------------------------------- decode attention: no rotation, out=


def _pool(n: int, nope: int, rope: int, gen: torch.Generator, ps: int = 16):
    from dsv4.quant.fp8 import quantize_act

    q, s = quantize_act(torch.randn(n * ps, nope, generator=gen, device=DEV), block=64)
    s = ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    r = torch.randn(n * ps, rope, generator=gen, device=DEV).to(torch.bfloat16)
    return SimpleNamespace(q=q.view(n, ps, nope).contiguous(), s=s.view(n, ps, -1).contiguous(),
                           rope=r.view(n, ps, rope).contiguous())


@pytest.mark.parametrize("ratio,splits", [(4, 1), (128, 2)])
def test_decode_attention_without_rotation_into_out(ratio, splits, poison):
    """cos=None + out= gives exactly what identity cos/sin + a copy gave, and no rotation at all."""
    from dsv4.kernels.attention import decode_attention, decode_attention_ref

    hd, nope, win, ring, heads = 512, 448, 128, 132, 4
    gen = torch.Generator(DEV).manual_seed(ratio + splits)
    positions = [300, 41]
    bsz = len(positions)
    c_pages = -(-(max(positions) // ratio + 1) // 16)
    wtab = torch.randperm(bsz * 9, generator=gen, device=DEV).view(bsz, 9)
    ctab = torch.randperm(bsz * c_pages, generator=gen, device=DEV).view(bsz, c_pages)
    cidx = ccnt = None
    if ratio == 4:
        cidx = torch.full((bsz, 8), -1, dtype=torch.int32, device=DEV)
        for b, p in enumerate(positions):
            pick = torch.randperm((p + 1) // 4, generator=gen, device=DEV)[:6]
            cidx[b, :pick.numel()] = pick.int()
    else:
        ccnt = torch.tensor([(p + 1) // ratio for p in positions], device=DEV)
    args = dict(q=torch.randn(bsz, heads, hd, generator=gen, device=DEV).to(torch.bfloat16),
                pos=torch.tensor(positions, device=DEV), window_pool=_pool(bsz * 9, nope, hd - nope, gen),
                window_table=wtab, ring=ring, window=win, comp_pool=_pool(bsz * c_pages, nope, hd - nope, gen),
                comp_table=ctab, comp_idx=cidx, comp_count=ccnt,
                sink=torch.randn(heads, generator=gen, device=DEV), scale=hd ** -0.5, splits=splits)
    one = torch.ones(bsz, (hd - nope) // 2, device=DEV)
    identity = decode_attention(cos=one, sin=torch.zeros_like(one), **args)
    poison()
    out = torch.empty_like(args["q"])
    got = decode_attention(cos=None, sin=None, out=out, **args)
    assert got is out
    assert torch.equal(out, identity), "no-rotation output differs from the identity rotation"
    ref = decode_attention_ref(cos=None, sin=None, **{k: v for k, v in args.items() if k != "splits"})
    err = float((out.double() - ref.double()).norm() / ref.double().norm())
    assert err < (1e-2 if CPU_INTERP else 4e-3)  # bf16 level: P is rounded per block (measured 2.0e-3)
    with pytest.raises(ValueError, match="both cos and sin"):
        decode_attention(cos=one, sin=None, **args)
    with pytest.raises(ValueError, match="out must be"):
        decode_attention(cos=None, sin=None, out=out.float(), **args)
