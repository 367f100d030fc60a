"""Indexer decode scores straight from the paged key pool (dsv4.kernels.indexer_scores) vs the torch
reference (itself `Indexer._scores_padded` on the pool's `read`) and a float64 re-derivation: engine
`_EntryPool`s (MXFP4 as with FP8 caches, plain bf16 otherwise) filled through their write path,
shuffled block tables padded with the trash page, absent slots, poisoned outputs."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
DI = 128


def _case(bsz: int, heads: int, ps: int, width: int, fp4: bool, holes: bool, gen: torch.Generator):
    """A pool of random keys and one query per row; rows hold 0 .. width*ps entries (derive's layout:
    page = table[:, j // ps], off = j % ps, present = j < count), `holes` also drops random slots."""
    from dsv4.engine.paged_state import _EntryPool

    pages = bsz * width + 2
    trash = pages  # the engine's extra page, written too (open windows land there)
    pool = _EntryPool(pages + 1, ps, DI, DI, False, torch.bfloat16, DEV, fp4=fp4)
    keys = torch.randn((pages + 1) * ps, DI, generator=gen, device=DEV)
    keys = keys * torch.exp2(torch.randint(-3, 4, (keys.shape[0], 1), generator=gen, device=DEV).float())
    every = torch.arange((pages + 1) * ps, device=DEV)
    pool.write(every // ps, every % ps, keys.to(torch.bfloat16))
    n = width * ps
    count = torch.randint(0, n + 1, (bsz,), generator=gen, device=DEV)
    count[0] = n  # one full row
    if bsz > 1:
        count[1] = 0  # one row with no entries: all -inf
    used = -(-count // ps)
    table = torch.randperm(pages, generator=gen, device=DEV)[: bsz * width].view(bsz, width)
    table = torch.where(torch.arange(width, device=DEV)[None, :] < used[:, None], table, trash)
    j = torch.arange(n, device=DEV)
    page, off = table[:, j // ps], (j % ps)[None, :].expand(bsz, -1)
    present = j[None, :] < count[:, None]
    if holes:
        present &= torch.rand(bsz, n, generator=gen, device=DEV) < 0.8
    q = torch.randn(bsz, heads, DI, generator=gen, device=DEV).to(torch.bfloat16)
    w = (torch.randn(bsz, heads, generator=gen, device=DEV) * DI ** -0.5 * heads ** -0.5).to(torch.bfloat16)
    return q, w, pool, page, off, present


def _ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 values at |x| (fp64)."""
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0 ** -126)))
    return torch.exp2(e - 7)


def _check_scores(got, ref, q, w, keys, present, what: str) -> None:
    """Scores vs a float64 re-derivation without the intermediate roundings, within a bound for them (each
    head's dot rounds to bf16, 2^-9 relative, the head sum too; fp32 sums add far less), and vs the
    reference: equal but for rare rounding flips in the fp32 sums, each within twice the bound. keys
    [B, N, di] per row, or [N, di] shared by every query."""
    spec = "bhd,bnd->bhn" if keys.dim() == 3 else "bhd,nd->bhn"
    s64 = torch.einsum(spec, q.double(), keys.double())
    absdot = torch.einsum(spec, q.double().abs(), keys.double().abs())
    exact = (torch.relu(s64) * w.double()[:, :, None]).sum(1)
    mag = ((s64.abs() + absdot * 2.0 ** -9) * w.double().abs()[:, :, None]).sum(1)
    bound = 2.0 ** -8 * (mag + exact.abs()) + 2.0 ** -126
    err = (got.double() - exact).abs()[present]
    assert (err <= bound[present]).all(), float((err / bound[present]).max())
    diff = (got.double() != ref.double()) & present
    frac = float(diff.double().sum() / present.sum().clamp_min(1))
    ulp1 = float((((got.double() - ref.double()).abs() <= _ulp_bf16(ref.double())) & diff).double().sum())
    print(f"{what}: {frac:.2e} of scores differ ({ulp1:.0f} of {float(diff.sum()):.0f} by one bf16 ulp)")
    assert frac <= 0.01, frac
    assert ((got.double() - ref.double()).abs()[diff] <= 2 * bound[diff]).all()


@pytest.mark.parametrize("bsz,heads,ps,width,fp4,holes", [
    (1, 64, 64, 3, True, False), (3, 64, 64, 5, True, True), (8, 64, 16, 9, True, False),
    (3, 16, 64, 2, True, False), (3, 64, 16, 7, False, True), (8, 16, 64, 1, False, False)])
def test_indexer_scores(bsz, heads, ps, width, fp4, holes, poison):
    from dsv4.kernels.indexer_scores import indexer_scores, indexer_scores_ref
    from dsv4.model.indexer import Indexer

    gen = torch.Generator(DEV).manual_seed(bsz * 1000 + heads + ps + width + fp4 + 2 * holes)
    q, w, pool, page, off, present = _case(bsz, heads, ps, width, fp4, holes, gen)
    keys = pool.read(page, off, torch.bfloat16)
    ref = indexer_scores_ref(q, w, pool, page, off, present)
    assert torch.equal(ref, Indexer._scores_padded(None, q, w, keys, present))  # the model's own math
    poison()
    got = indexer_scores(q, w, pool, page, off, present)
    assert got.shape == present.shape and got.dtype == torch.bfloat16
    assert torch.equal(torch.isneginf(got), ~present) and torch.isfinite(got[present]).all()

    _check_scores(got, ref, q, w, keys, present, f"B={bsz} Hi={heads} N={present.shape[1]} fp4={fp4}")

    # the glue: torch top-k over these scores, as pick_padded does over the reference's
    ix = Indexer.__new__(Indexer)
    object.__setattr__(ix, "topk", 24)
    object.__setattr__(ix, "use_kernels", False)  # torch's sort-based top-k
    listed = ix.pick_from_pool(q, w, pool, page, off, present)  # the attention's list: -1 where not a real pick
    picked, valid = ix._pick(got, present)
    assert torch.equal(listed, torch.where(valid, picked, -1))
    if got.is_cuda:  # kernel mode: the one-launch radix select picks the same list
        object.__setattr__(ix, "use_kernels", True)
        assert torch.equal(ix.pick_from_pool(q, w, pool, page, off, present), listed)
    same = (got == ref).all(1) | (torch.isneginf(got) & torch.isneginf(ref)).all(1)
    ref_picked, ref_valid = ix.pick_padded(q, w, keys, present)
    assert torch.equal(picked[same], ref_picked[same]) and torch.equal(valid[same], ref_valid[same])


@pytest.mark.parametrize("bsz,heads,ps,width,fp4,holes,k", [
    (1, 64, 64, 3, True, False, 24), (3, 64, 16, 9, True, True, 24), (8, 16, 64, 2, True, False, 128),
    (3, 64, 16, 7, False, True, 5)])
def test_indexer_pick_is_scores_then_topk(bsz, heads, ps, width, fp4, holes, k, poison, monkeypatch):
    """`indexer_pick` (indexer.TOPK_IN_SCORES: each row's last-arriving scores program picks the top k): the picks
    and their valid flags of the scores launch followed by the top-k launch, on repeated launches (the counters
    left at zero; k up to every slot of a row), with mark_absent the picks' list with -1 where not valid, and through
    `Indexer.pick_from_pool` (that list) with the flag on and off."""
    from dsv4.kernels import _triton
    from dsv4.kernels.indexer_scores import indexer_pick, indexer_scores
    from dsv4.kernels.topk import topk_lowest_index
    from dsv4.model import indexer
    from dsv4.model.indexer import Indexer

    gen = torch.Generator(DEV).manual_seed(bsz * 100 + heads + ps + width + fp4 + 2 * holes + k)
    q, w, pool, page, off, present = _case(bsz, heads, ps, width, fp4, holes, gen)
    k = min(k, page.shape[1])
    want = topk_lowest_index(indexer_scores(q, w, pool, page, off, present), k, present)
    for _ in range(20 if DEV == "cuda" else 2):
        poison()
        got = indexer_pick(q, w, pool, page, off, present, k)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(int(b.count_nonzero()) == 0 for bufs in _triton._counter_cache.values() for b in bufs)
    marked = torch.where(want[1], want[0], -1)
    assert not holes or bool((marked < 0).any())  # (the cases with holes pick absent slots)
    got = indexer_pick(q, w, pool, page, off, present, k, mark_absent=True)
    assert torch.equal(got[0], marked) and torch.equal(got[1], want[1])
    ix = Indexer.__new__(Indexer)
    object.__setattr__(ix, "topk", k)
    object.__setattr__(ix, "use_kernels", True)
    for fused in (True, False):
        for mark in (True, False):
            monkeypatch.setattr(indexer, "TOPK_IN_SCORES", fused)
            monkeypatch.setattr(indexer, "MARK_ABSENT", mark)
            assert torch.equal(ix.pick_from_pool(q, w, pool, page, off, present), marked), (fused, mark)
    with pytest.raises(ValueError, match="k must be"):
        indexer_pick(q, w, pool, page, off, present, page.shape[1] + 1)


def test_indexer_scores_rejects_bad_inputs():
    from dsv4.kernels.indexer_scores import indexer_scores

    gen = torch.Generator(DEV).manual_seed(7)
    q, w, pool, page, off, present = _case(2, 16, 16, 2, True, False, gen)
    with pytest.raises(ValueError, match="q must be bf16"):
        indexer_scores(q.float(), w, pool, page, off, present)
    with pytest.raises(ValueError, match="weights"):
        indexer_scores(q, w[:, :8], pool, page, off, present)
    with pytest.raises(ValueError, match="page/off/present"):
        indexer_scores(q, w, pool, page[:, :5], off, present)
    with pytest.raises(ValueError, match="present bool"):
        indexer_scores(q, w, pool, page, off, present.int())
    with pytest.raises(ValueError, match="MXFP4 pool"):
        indexer_scores(q[..., :64].contiguous(), w, pool, page, off, present)


@pytest.mark.parametrize("gluon", [False, True])
@pytest.mark.parametrize("t,heads,n,start", [(48, 8, 40, 0), (300 if DEV == "cuda" else 130, 64, 700, 2000),
                                              (70, 16, 33, 5)])  # (the interpreter: fewer queries, for its time)
def test_prefill_index_scores_and_select(t, heads, n, start, gluon, poison, monkeypatch):
    """A prompt chunk's queries (positions start .. start+t-1) against one sequence's keys: the kernel's
    scores vs the reference (-inf exactly where an entry is not yet visible, the rest equal but for rare
    1-ulp flips, all within the float64 bound), and the model's kernel-mode selection vs its torch one.
    gluon: through `indexer_scores_gluon` (compiled only: GPU), whose scores must equal the Triton kernel's."""
    from dsv4.kernels import indexer_scores
    from dsv4.kernels.indexer_scores import prefill_index_scores, prefill_index_scores_ref
    from dsv4.model.indexer import Indexer
    from dsv4.model.numerics import NUMERICS
    from dsv4.model.rope import shared_cos_sin

    if gluon and DEV != "cuda":
        pytest.skip("Gluon kernels are compiled, not interpreted")
    monkeypatch.setattr(indexer_scores, "PREFILL_GLUON_MIN_KEYS", 0 if gluon else 1 << 62)

    gen = torch.Generator(DEV).manual_seed(t * 7 + heads + n + start)
    keys = torch.randn(n, DI, generator=gen, device=DEV)
    keys = (keys * torch.exp2(torch.randint(-3, 4, (n, 1), generator=gen, device=DEV).float())).to(torch.bfloat16)
    q = torch.randn(t, heads, DI, generator=gen, device=DEV).to(torch.bfloat16)
    w = (torch.randn(t, heads, generator=gen, device=DEV) * DI ** -0.5 * heads ** -0.5).to(torch.bfloat16)
    positions = torch.arange(start, start + t, device=DEV)
    visible = ((positions + 1) // 4).clamp_max(n).to(torch.int32)
    ref = prefill_index_scores_ref(q, w, keys, visible)
    poison()
    got = prefill_index_scores(q, w, keys, visible)
    if gluon:
        from dsv4.kernels.indexer_scores_gluon import supports

        assert supports(q, keys)
        monkeypatch.setattr(indexer_scores, "PREFILL_GLUON_MIN_KEYS", 1 << 62)
        assert torch.equal(got, prefill_index_scores(q, w, keys, visible)), "Gluon and Triton scores differ"
        monkeypatch.setattr(indexer_scores, "PREFILL_GLUON_MIN_KEYS", 0)
    present = torch.arange(n, device=DEV)[None, :] < visible[:, None]
    assert torch.equal(torch.isneginf(got), ~present) and torch.isfinite(got[present]).all()
    _check_scores(got, ref, q, w, keys, present, f"prefill T={t} Hi={heads} N={n}")

    ix = Indexer.__new__(Indexer)
    nn_init = torch.nn.Module.__init__
    nn_init(ix)
    ix.topk, ix.ratio, ix.use_kernels = 24, 4, False
    ix.numerics = NUMERICS["transformers"]  # (bf16 operands: not FP4-simulated)
    want = ix.select_indices(q, w, keys, positions)
    ix.use_kernels = True
    # kernel mode selects on CUDA; the interpreter takes its kernel path directly
    select = ix.select_indices if got.is_cuda else ix._select_kernel
    with shared_cos_sin():  # twice in one forward's scope: the second call takes the visible counts kept
        picked = select(q, w, keys, positions)
        again = select(q, w, keys, positions[:])
    assert torch.equal(again, picked)
    assert picked.dtype == torch.int32  # (as the prefill attention kernel reads the lists)
    picked = picked.long()
    assert picked.shape == want.shape == (t, min(24, n))
    same = (got == ref).all(1)  # rows whose scores match the reference's exactly pick the same set
    assert torch.equal(_as_sets(picked[same]), _as_sets(want[same]))
    assert torch.equal(_as_sets(picked), torch.where(picked < 0, torch.iinfo(picked.dtype).max, picked))  # ascending
    assert bool(same.double().mean() >= 0.5)


def _as_sets(idx: torch.Tensor) -> torch.Tensor:
    """Rows of entry lists (-1 = none) in a canonical order: ascending, the -1s last."""
    big = torch.iinfo(idx.dtype).max
    return torch.where(idx < 0, big, idx).sort(dim=1).values


def test_gluon_prefill_scores_take_only_what_they_support():
    """`indexer_scores_gluon.supports` (the routing's guard, the Triton kernel otherwise): head dim 128, heads a
    multiple of its 8-head groups, rows whose copies are 16-byte aligned."""
    from dsv4.kernels.indexer_scores_gluon import supports

    q = torch.randn(10, 64, 128).to(torch.bfloat16)
    keys = torch.randn(50, 128).to(torch.bfloat16)
    assert supports(q, keys)
    assert not supports(q[:, :60], keys)  # 60 heads
    assert not supports(q[..., :64].contiguous(), keys[:, :64].contiguous())  # head dim 64
    assert not supports(q, torch.randn(50, 130).to(torch.bfloat16)[:, :128])  # key rows 260 bytes apart
    shifted = torch.empty(q.numel() + 1, dtype=torch.bfloat16)[1:].view(q.shape)  # data 2 bytes off 16
    assert not supports(shifted, keys)


@pytest.mark.parametrize("n,shape,want", [(100, {}, "gluon"), (99, {}, "triton"), (100, {"warps": 4}, "triton")])
def test_prefill_scores_route_by_key_count(n, shape, want, monkeypatch):
    """`prefill_index_scores` takes the Gluon kernel from PREFILL_GLUON_MIN_KEYS keys when no launch shape is asked
    for, the Triton kernel otherwise (both launches replaced by recorders: this checks the routing only)."""
    from dsv4.kernels import indexer_scores, indexer_scores_gluon

    took = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kw: took.append("triton")

    monkeypatch.setattr(indexer_scores, "INTERPRET", False)
    monkeypatch.setattr(indexer_scores, "PREFILL_GLUON_MIN_KEYS", 100)
    monkeypatch.setattr(indexer_scores, "_prefill_scores_kernel", Recorder())
    monkeypatch.setattr(indexer_scores_gluon, "prefill_index_scores_gluon",
                        lambda q, w, k, v, out, *guard: took.append("gluon") or out)
    q = torch.randn(20, 8, DI).to(torch.bfloat16)
    w = torch.randn(20, 8)
    keys = torch.randn(n, DI).to(torch.bfloat16)
    indexer_scores.prefill_index_scores(q, w, keys, torch.full((20,), n, dtype=torch.int32), **shape)
    assert took == [want]


def _fp4_operands(t: int, heads: int, n: int, gen: torch.Generator):
    """An FP4-simulated chunk as the model's reference numerics give it: q [t, heads, DI], w [t, heads],
    keys [n, DI]."""
    from dsv4.model.numerics import simulate_indexer_fp4

    def rows(*shape):
        x = torch.randn(*shape, DI, generator=gen, device=DEV)
        return simulate_indexer_fp4(x * torch.exp2(torch.randint(-4, 5, (*shape, 1), generator=gen, device=DEV)))

    q, keys = rows(t, heads).to(torch.bfloat16), rows(n).to(torch.bfloat16)
    w = (torch.randn(t, heads, generator=gen, device=DEV) * DI ** -0.5 * heads ** -0.5).to(torch.bfloat16)
    return q, w, keys


def _spread_row(x: torch.Tensor) -> None:
    """Make x's 128-d row (in place) one whose blocks lie 2^20 apart: it does not fold (`indexer_fp8`)."""
    x[32:] = (x[32:].float() * 2.0 ** -20).to(x.dtype)


@pytest.mark.parametrize("bad", [False, True])
def test_fold_rows_matches_the_reference(bad):
    """`indexer_fp8.fold_rows` vs `fold_rows_ref`: the e4m3 bytes, the per-row scales (with and without weights)
    and the flag, which one row that does not fold clears (and a zero row does not)."""
    from dsv4.kernels.indexer_fp8 import fold_rows, fold_rows_ref

    gen = torch.Generator(DEV).manual_seed(3 + bad)
    q, w, keys = _fp4_operands(37, 8, 45, gen)
    q[2, 5] = 0
    if bad:
        _spread_row(keys[40])
    for x, ww in ((q, w), (keys, None)):
        ok = torch.ones(1, dtype=torch.int32, device=DEV)
        x8, s = fold_rows(x, ww, ok)
        flat = x.reshape(-1, DI)
        r8, rs, rok = fold_rows_ref(flat, None if ww is None else ww.reshape(-1))
        assert torch.equal(x8.reshape(-1, DI).view(torch.uint8), r8.view(torch.uint8))
        assert torch.equal(s.reshape(-1), rs)
        assert bool(ok.item()) is rok is not (bad and ww is None)


@pytest.mark.parametrize("gluon", [False, True])
@pytest.mark.parametrize("t,heads,n,bad", [(70, 16, 300, False), (70, 16, 300, True), (300, 64, 700, False)])
def test_prefill_fp8_scores_equal_the_bf16_ones(t, heads, n, bad, gluon, poison, monkeypatch):
    """FP4-simulated operands (`prefill_index_scores(fp4=True)`): the FP8 dots on folded operands give exactly the
    bf16 kernel's scores; with one q row that does not fold, the bf16 launch behind the guard gives them (the
    flag read back to see which ran). Also within the float64 bound of the reference."""
    from dsv4.kernels import indexer_fp8, indexer_scores
    from dsv4.kernels.indexer_scores import prefill_index_scores, prefill_index_scores_ref

    if gluon and DEV != "cuda":
        pytest.skip("Gluon kernels are compiled, not interpreted")
    if heads * n > 20000 and DEV != "cuda":
        pytest.skip("interpreter: 40 s for this size (runs on the GPU)")
    monkeypatch.setattr(indexer_scores, "PREFILL_GLUON_MIN_KEYS", 0 if gluon else 1 << 62)
    monkeypatch.setattr(indexer_scores, "PREFILL_FP8", True)
    monkeypatch.setattr(indexer_scores, "PREFILL_FP8_GLUON", gluon)
    monkeypatch.setattr(indexer_scores, "PREFILL_FP8_MIN_KEYS", 0)
    flags = []
    real = indexer_fp8.fold_rows
    monkeypatch.setattr(indexer_fp8, "fold_rows", lambda x, w, ok: flags.append(ok) or real(x, w, ok))
    gen = torch.Generator(DEV).manual_seed(t + heads + n + bad)
    q, w, keys = _fp4_operands(t, heads, n, gen)
    if bad:
        _spread_row(q[t // 2, 3])
    visible = ((torch.arange(2000, 2000 + t, device=DEV) + 1) // 4).clamp_max(n).to(torch.int32)
    poison()
    got = prefill_index_scores(q, w, keys, visible, fp4=True)
    assert len(flags) == 2 and flags[0] is flags[1] and flags[0].item() == (0 if bad else 1)
    want = prefill_index_scores(q, w, keys, visible)
    assert torch.equal(got, want)
    present = torch.arange(n, device=DEV)[None, :] < visible[:, None]
    _check_scores(got, prefill_index_scores_ref(q, w, keys, visible), q, w, keys, present,
                  f"fp8 prefill T={t} Hi={heads} N={n}")
    if bad:  # (forced through the FP8 launch, the row that does not fold may round otherwise)
        return
    # each launch alone behind its guard: it writes every score when its turn, nothing otherwise
    q8, w8 = real(q, w, torch.ones(1, dtype=torch.int32, device=DEV))
    k8, sk = real(keys, None, torch.ones(1, dtype=torch.int32, device=DEV))
    for guard, args in ((1, (q8, w8, k8, visible, sk)), (2, (q, w, keys, visible, None))):
        for flag in (0, 1):
            out = torch.full_like(got, 7.0)
            ok = torch.full((1,), flag, dtype=torch.int32, device=DEV)
            indexer_scores._prefill_launch(*args[:4], out, (None,) * 4, args[4], ok, guard)
            assert torch.equal(out, got) if (flag == 1) == (guard == 1) else bool((out == 7.0).all())
