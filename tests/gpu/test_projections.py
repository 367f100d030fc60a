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


# --------------------------------------------------------------------------- one-launch decode GEMV + epilogue

# name -> (K, gates as (column, ratio, width), head weights (column, heads) or None, N): the fused weight's
# layouts, tiny (N not a multiple of the row tile; K not a multiple of the K slice in the CSA case)
DECODE_SHAPES = {
    "csa": (320, [(128, 4, 128), (320, 4, 64)], (384, 16), 400),   # main wkv|wgate | index wkv|wgate | heads
    "hca": (256, [(128, 128, 128)], None, 256),                    # main compressor only
}


def _decode_inputs(kind: str, t: int):
    k, gates, head, n = DECODE_SHAPES[kind]
    gen = torch.Generator(DEV).manual_seed(100 * t + k)
    a = torch.randn(t, k, generator=gen, device=DEV).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen, device=DEV) * k ** -0.5).to(torch.bfloat16)
    positions = torch.randint(0, 1 << 20, (t,), generator=gen, device=DEV)
    g = [(col, torch.randn(r, wd, generator=gen, device=DEV)) for col, r, wd in gates]
    hw = None if head is None else (head[0], head[1], 128 ** -0.5 * 16 ** -0.5)
    return a, w, positions, g, hw


def _summation_bound(a: torch.Tensor, w: torch.Tensor, g) -> torch.Tensor:
    """Elementwise bound on |fp32 result - exact| for sums of K exact products (+ one ape add) in any
    order: gamma_(K+1) * sum |terms|, with twice fp32's unit roundoff (tensor-core adds may truncate)."""
    mag = a.double().abs() @ w.double().abs().T
    for col, ape in g:
        mag[:, col:col + ape.shape[1]] += ape.double().abs().max()
    return (a.shape[1] + 2) * 2.0 ** -23 * mag + 1e-30


@pytest.mark.parametrize("kind", ["csa", "hca"])
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_project_decode_matches_references(kind, tokens, poison):
    from dsv4.kernels._triton import arrival_counters
    from dsv4.kernels.projections import finish_projections, finish_projections_ref, project_decode

    a, w, positions, g, hw = _decode_inputs(kind, tokens)
    poison()
    y, w_k = project_decode(a, w, positions, g, hw)
    assert y.dtype == torch.float32 and y.shape == (tokens, w.shape[0]) and y.is_contiguous()
    assert torch.isfinite(y).all(), "unwritten y"
    # float64 re-derivation: exact GEMM, then the gates
    want = a.double() @ w.double().T
    for col, ape in g:
        want[:, col:col + ape.shape[1]] += ape.double()[positions.long() % ape.shape[0]]
    bound = _summation_bound(a, w, g)
    assert ((y.double() - want).abs() <= bound).all(), "y outside the fp32 summation bound"
    # the two-launch path (cuBLAS on CUDA, fp32 F.linear on CPU) + finish_projections: the same up to order
    from dsv4.model.linear import bf16_gemm_fp32
    y2 = bf16_gemm_fp32(a, w)
    y2 = torch.nn.functional.linear(a.float(), w.float()) if y2 is None else y2
    w2 = finish_projections(y2, positions, g, hw)
    assert ((y.double() - y2.double()).abs() <= 2 * bound).all(), "y far from the two-launch path"
    # the epilogue is exact: the launch without gates/heads gives the same sums (same tiling, fixed order)
    y_raw, none = project_decode(a, w, positions, [], None)
    assert none is None
    w_fin = finish_projections(y_raw, positions, g, hw)  # the same jitted epilogue, as its own launch
    assert torch.equal(y, y_raw), "gate columns differ from finish_projections on the same sums"
    y_ref = project_decode(a, w, positions, [], None)[0]
    w_ref = finish_projections_ref(y_ref, positions, g, hw)
    assert torch.equal(y, y_ref), "gate columns differ from the torch epilogue on the same sums"
    if hw is None:
        assert w_k is None and w2 is None
    else:
        assert w_k.dtype == torch.bfloat16 and w_k.shape == (tokens, hw[1]) and w_k.is_contiguous()
        assert torch.isfinite(w_k).all(), "unwritten head weights"
        assert torch.equal(w_k, w_fin), "head weights differ from finish_projections on the same sums"
        assert _bf16_ulps(w_k, w_ref) <= (2 if CPU_INTERP else 0)
        assert _bf16_ulps(w_k, w2) <= (2 if CPU_INTERP else 1)  # rounding boundary straddles only
        w64 = want[:, hw[0]:hw[0] + hw[1]] * hw[2]
        assert torch.allclose(w_k.double(), w64, rtol=2 ** -6 if CPU_INTERP else 2 ** -7, atol=1e-6)
    # deterministic, and every arrival counter back at zero for the next launch / graph replay
    y_again, w_again = project_decode(a, w, positions, g, hw)
    assert torch.equal(y_again, y) and (hw is None or torch.equal(w_again, w_k))
    assert int(arrival_counters("projections project_decode", y.device, 1).abs().sum()) == 0


def test_project_decode_tilings_agree():
    """Another tiling (16-row tiles, 64-wide K slices, 32-wide dot steps) sums in another order: within
    the bound, the same epilogue."""
    from dsv4.kernels.projections import finish_projections, project_decode

    a, w, positions, g, hw = _decode_inputs("csa", 5)
    y, w_k = project_decode(a, w, positions, g, hw, block_n=16, k_slice=64, block_k=32)
    want = a.double() @ w.double().T
    for col, ape in g:
        want[:, col:col + ape.shape[1]] += ape.double()[positions.long() % ape.shape[0]]
    assert ((y.double() - want).abs() <= _summation_bound(a, w, g)).all()
    y_raw = project_decode(a, w, positions, [], None, block_n=16, k_slice=64, block_k=32)[0]
    assert torch.equal(finish_projections(y_raw, positions, g, hw), w_k)  # y_raw gets the gates in place
    assert torch.equal(y_raw, y)


def test_project_decode_rejects_bad_input():
    from dsv4.kernels.projections import DECODE_MAX_T, project_decode

    a, w, positions, g, hw = _decode_inputs("csa", 2)
    big = torch.zeros(DECODE_MAX_T + 1, a.shape[1], dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match="at most"):
        project_decode(big, w, torch.zeros(DECODE_MAX_T + 1, dtype=torch.long, device=DEV), g, hw)
    with pytest.raises(ValueError, match="bf16"):
        project_decode(a.float(), w, positions, g, hw)
    with pytest.raises(ValueError, match="positions"):
        project_decode(a, w, positions[:1], g, hw)
    with pytest.raises(ValueError, match="overlap"):
        project_decode(a, w, positions, g, (g[1][0], 16, 1.0))
    with pytest.raises(ValueError, match="outside"):
        project_decode(a, w, positions, g, (w.shape[0] - 8, 16, 1.0))
    with pytest.raises(ValueError, match="powers of two"):
        project_decode(a, w, positions, g, hw, block_n=24)


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_project_fused_decode_flag(kind, poison, monkeypatch):
    """DECODE_GEMV on: kernel-mode `prepare` takes project_decode (one launch) for T <= DECODE_MAX_T and
    matches the flag-off path (same GEMM up to order, same epilogue) and the torch path."""
    from dsv4.kernels import projections as pj

    cfg, attn, gen = _layer(kind, seed=21 if kind == "csa" else 22)
    t = 3
    a = torch.randn(t, cfg.hidden_size, generator=gen, device=DEV).to(torch.bfloat16)
    positions = torch.tensor([7, 4096, 70001], device=DEV)
    ref = attn.prepare(a, positions)
    attn.use_kernels = True
    if attn.indexer:
        attn.indexer.use_kernels = True
    off = attn.prepare(a, positions)
    calls = []
    decode = pj.project_decode
    monkeypatch.setattr(pj, "project_decode", lambda *args, **kw: calls.append(1) or decode(*args, **kw))
    monkeypatch.setattr(pj, "DECODE_GEMV", True)
    poison()
    on = attn.prepare(a, positions)
    assert calls == [1], "the flag did not route _project_fused through project_decode"
    pairs = [("rows", on.rows, off.rows, ref.rows)]
    if kind == "csa":
        pairs.append(("index_rows", on.index_rows, off.index_rows, ref.index_rows))
    else:
        assert on.index_rows is None and on.index_w is None
    for what, g, o, r in pairs:
        for part, x, y, z in zip("cz", g, o, r):
            assert x.dtype == torch.float32 and x.shape == y.shape and torch.isfinite(x).all()
            for other in (y, z):
                err = float((x.double() - other.double()).abs().max() / other.double().abs().max())
                assert err < 1e-5, f"{what}.{part}: {err:.2e}"
    if kind == "csa":
        assert on.index_w.shape == off.index_w.shape and on.index_w.dtype == torch.bfloat16
        assert _bf16_ulps(on.index_w, off.index_w) <= (2 if CPU_INTERP else 1)
        assert _bf16_ulps(on.index_w, ref.index_w) <= (2 if CPU_INTERP else 1)
    if kind == "csa":
        return
    calls.clear()  # more rows than one launch takes: the two-launch path
    attn.prepare(torch.randn(pj.DECODE_MAX_T + 1, cfg.hidden_size, generator=gen, device=DEV).to(torch.bfloat16),
                 torch.arange(pj.DECODE_MAX_T + 1, device=DEV))
    assert calls == []
