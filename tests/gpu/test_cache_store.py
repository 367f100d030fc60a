"""The paged decode step's fused cache writes (dsv4.kernels.cache_store) vs their torch references:
window pooling of the compressor state (CSA with the previous window, entry 0 without it, HCA),
and the norm -> RoPE -> FP8 / Hadamard -> MXFP4 stores into pools poisoned with random bytes, whose
every other slot must stay untouched."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
INTERP = os.environ.get("TRITON_INTERPRET") == "1"  # the CPU interpreter truncates fp32 -> bf16


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


@pytest.mark.parametrize("ratio,dim,overlap", [(4, 512, True), (4, 128, True), (128, 512, False)])
def test_pool_windows_matches_reference(ratio, dim, overlap):
    from dsv4.kernels.cache_store import pool_windows, pool_windows_ref

    g = _gen(ratio + dim)
    bsz, pages, cap = 6, 9, 2 * ratio + 4 + (ratio if overlap else 0)
    width = (2 if overlap else 1) * dim
    rows = torch.randn(2, pages, cap, width, generator=g, device=DEV) * 3
    page = torch.randperm(pages, generator=g, device=DEV)[:bsz]
    t = torch.randint(0, 5000, (bsz,), generator=g, device=DEV)
    t[0] = ratio - 1  # entry 0: no previous window
    first = (t // ratio) * ratio - (ratio if overlap else 0)
    p = first[:, None] + torch.arange((2 if overlap else 1) * ratio, device=DEV)[None, :]
    slots = p.clamp(min=0) % cap
    has_prev = t >= ratio
    got = pool_windows(rows[0], rows[1], page, slots, has_prev, ratio, dim)
    want = pool_windows_ref(rows[0], rows[1], page, slots, has_prev, ratio, dim)
    assert got.shape == (bsz, dim) and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    # float64 re-derivation of one row (softmax over the window per column)
    b = 1
    c, z = rows[0, page[b], slots[b]].double(), rows[1, page[b], slots[b]].double()
    if overlap:
        c, z = torch.cat((c[:ratio, :dim], c[ratio:, dim:])), torch.cat((z[:ratio, :dim], z[ratio:, dim:]))
    exact = (torch.softmax(z, 0) * c).sum(0)
    torch.testing.assert_close(got[b].double(), exact, rtol=1e-5, atol=1e-5)


def _pools(kind: str, pages: int, ps: int, g):
    from dsv4.engine.paged_state import _EntryPool
    if kind == "fp8":
        pool = _EntryPool(pages, ps, 512, 448, True, torch.bfloat16, DEV)
    else:
        pool = _EntryPool(pages, ps, 128, 128, False, torch.bfloat16, DEV, fp4=True)
    for name in ("q", "s", "rope"):  # poison: random bytes everywhere
        t = getattr(pool, name, None)
        if t is not None and (kind == "fp8" or name != "rope"):
            raw = torch.randint(0, 256, t.view(torch.uint8).shape, generator=g, device=DEV,
                                dtype=torch.int32).to(torch.uint8)
            if t.dtype == torch.float8_e4m3fn:
                raw = raw & 0x77  # finite e4m3 bytes (0x7f/0xff are NaN)
            t.view(torch.uint8).copy_(raw)
    return pool


def _clone(pool):
    import copy
    other = copy.copy(pool)
    for name in ("q", "s", "rope", "data"):
        if hasattr(pool, name):
            setattr(other, name, getattr(pool, name).clone())
    return other


@pytest.mark.parametrize("case", ["kv", "main", "index"])
def test_store_rows_matches_reference(case):
    from dsv4.config import Rope, Yarn
    from dsv4.kernels.cache_store import store_rows, store_rows_ref
    from dsv4.model.numerics import hadamard_matrix
    from dsv4.model.rope import RotaryEmbedding

    g = _gen({"kv": 1, "main": 2, "index": 3}[case])
    bsz, pages, ps = 7, 5, 16
    dim = 128 if case == "index" else 512
    pool = _pools("fp4" if case == "index" else "fp8", pages, ps, g)
    page = torch.randint(0, pages, (bsz,), generator=g, device=DEV)
    off = torch.randperm(ps, generator=g, device=DEV)[:bsz]
    kw = {}
    if case == "kv":  # window kv: already normed and roped, bf16
        x = torch.randn(bsz, dim, generator=g, device=DEV).to(torch.bfloat16)
    else:  # pooled fp32 rows, magnitudes over a few binades
        x = torch.randn(bsz, dim, generator=g, device=DEV) * torch.exp2(torch.randint(-3, 4, (bsz, 1), generator=g,
                                                                                    device=DEV).float())
        rope = RotaryEmbedding(64, Rope(theta=160000.0, yarn=Yarn(16.0, 65536, 32.0, 1.0)))
        cos, sin = rope.cos_sin(torch.randint(0, 40000, (bsz,), generator=g, device=DEV) * 4)
        kw = dict(norm_weight=(1 + 0.3 * torch.randn(dim, generator=g, device=DEV)).to(torch.bfloat16), eps=1e-6,
                  cos=cos, sin=sin)
        if case == "index":
            kw["hadamard"] = hadamard_matrix(dim, torch.float32, DEV)
    want, got = _clone(pool), _clone(pool)
    store_rows_ref(x, page, off, want, **kw)
    store_rows(x, page, off, got, **kw)
    written = torch.zeros(pages, ps, dtype=torch.bool, device=DEV)
    written[page, off] = True
    for name in ("q", "s", "rope"):
        if case == "index" and name == "rope":
            continue
        a, b = getattr(want, name).view(torch.uint8), getattr(got, name).view(torch.uint8)
        assert torch.equal(a[~written], b[~written]), f"{name}: a slot outside (page, off) changed"
    deq_want = want.read(page, off, torch.float32)
    deq_got = got.read(page, off, torch.float32)
    assert torch.isfinite(deq_got).all()
    # identical up to rare fp32-order rounding ties (RMS sum, Hadamard sum, FMA in RoPE)
    diff = (deq_got != deq_want).double().mean()
    rel = float((deq_got - deq_want).norm() / deq_want.norm())
    print(f"{case}: {float(diff):.2e} of elements differ, rel {rel:.2e}")
    assert rel < (0.1 if INTERP else 5e-3) and diff < (0.2 if INTERP else 0.01), (float(diff), rel)
    if case == "kv":  # no arithmetic before the quantisation: bit-exact values
        assert INTERP or torch.equal(deq_got, deq_want)


@pytest.mark.parametrize("bsz,rows_from", [(1, 2048), (5, 2048), (6, 4)])
def test_norm_rope_two_stores_the_window_kv(bsz, rows_from, monkeypatch):
    """`norm_rope_two(..., store_b=)` (the paged decode step's q latent + window kv with the kv's store in the same
    launch): both outputs and every pool byte equal those of the unfused launch followed by `store_rows` of its kv
    output; at several rows per program (rows_from 4: a prefill-sized call) the store falls back to that call."""
    from dsv4.config import Rope
    from dsv4.kernels import norm_rope as nr
    from dsv4.kernels.cache_store import store_rows
    from dsv4.model.rope import RotaryEmbedding

    monkeypatch.setattr(nr, "ROWS_FROM", rows_from)
    g = _gen(40 + bsz)
    pages, ps, dim, lat = 5, 16, 512, 1024
    pool = _pools("fp8", pages, ps, g)
    page = torch.randint(0, pages, (bsz,), generator=g, device=DEV)
    off = torch.randperm(ps, generator=g, device=DEV)[:bsz]
    rope = RotaryEmbedding(64, Rope(theta=10000.0, yarn=None))
    cos, sin = rope.cos_sin(torch.randint(0, 40000, (bsz,), generator=g, device=DEV))
    q_latent = (torch.randn(bsz, lat, generator=g, device=DEV) * 3).to(torch.bfloat16)
    kv = (torch.randn(bsz, dim, generator=g, device=DEV) * 5).to(torch.bfloat16)
    q_kw = dict(norm=nr.WEIGHTED, weight=(1 + 0.3 * torch.randn(lat, generator=g, device=DEV)).to(torch.bfloat16),
                eps=1e-6)
    kv_kw = dict(norm=nr.WEIGHTED, weight=(1 + 0.3 * torch.randn(dim, generator=g, device=DEV)).to(torch.bfloat16),
                 eps=1e-6, cos=cos, sin=sin, sim=nr.SIM_FP8, nope=448)
    assert nr._stores_in_kernel(kv, nr._plan(kv, **kv_kw)[2], pool) == (rows_from > bsz)
    want, got = _clone(pool), _clone(pool)
    qa, kva = nr.norm_rope_two(q_latent, q_kw, kv, kv_kw)
    store_rows(kva, page, off, want)
    qb, kvb = nr.norm_rope_two(q_latent, q_kw, kv, kv_kw, store_b=(page, off, got))
    assert torch.equal(qa, qb) and torch.equal(kva, kvb)
    for name in ("q", "s", "rope"):
        a, b = getattr(want, name).view(torch.uint8), getattr(got, name).view(torch.uint8)
        assert torch.equal(a, b), f"pool {name} differs"
    assert not torch.equal(want.q.view(torch.uint8), pool.q.view(torch.uint8)), "nothing was stored"
    with pytest.raises(ValueError, match="norm_rope_two: the kernel writes FP8/FP4 pools only"):
        from dsv4.engine.paged_state import _EntryPool
        plain = _EntryPool(pages, ps, dim, 448, False, torch.bfloat16, DEV)
        nr.norm_rope_two(q_latent, q_kw, kv, kv_kw, store_b=(page, off, plain))


def _state_windows(g, bsz: int, ratio: int, dim: int, overlap: bool, first_entry: bool):
    """A compressor state pool of random (C, Z) rows [2, 8 pages, cap, width] and bsz rows' windows at random
    positions t (row 0 at the first entry's window with first_entry) -> (width, rows, page, t, slots, has_prev, the
    slot of t)."""
    pages, cap = 8, 2 * ratio + 4 + (ratio if overlap else 0)
    width = (2 if overlap else 1) * dim
    rows = torch.randn(2, pages, cap, width, generator=g, device=DEV) * 3
    page = torch.randperm(pages, generator=g, device=DEV)[:bsz]
    t = torch.randint(0, 5000, (bsz,), generator=g, device=DEV)
    if first_entry:
        t[0] = ratio - 1
    first = (t // ratio) * ratio - (ratio if overlap else 0)
    p = first[:, None] + torch.arange((2 if overlap else 1) * ratio, device=DEV)[None, :]
    return width, rows, page, t, p.clamp(min=0) % cap, t >= ratio, t % cap


@pytest.mark.parametrize("ratio,dim,overlap", [(4, 128, True), (128, 512, False)])
def test_pool_windows_stores_the_new_rows_first(ratio, dim, overlap):
    """`new_rows`: the step's (C, Z) rows land at their slot (strided column views accepted) and the
    pooling sees them -- the same pools and result as writing them first and pooling after."""
    from dsv4.kernels.cache_store import pool_windows, pool_windows_ref

    g = _gen(7 * ratio + dim)
    bsz = 5
    width, rows, page, t, slots, has_prev, cur = _state_windows(g, bsz, ratio, dim, overlap, first_entry=True)
    both = torch.randn(bsz, 2 * width + 3, generator=g, device=DEV) * 3  # c and z as column views
    new = (both[:, :width], both[:, width:2 * width], cur)
    mine, ref = rows.clone(), rows.clone()
    got = pool_windows(mine[0], mine[1], page, slots, has_prev, ratio, dim, new_rows=new)
    want = pool_windows_ref(ref[0], ref[1], page, slots, has_prev, ratio, dim, new_rows=new)
    assert torch.equal(mine, ref)  # the new rows stored, nothing else touched
    assert torch.equal(mine[0, page, cur], new[0]) and torch.equal(mine[1, page, cur], new[1])
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    with pytest.raises(ValueError, match="new rows"):
        pool_windows(mine[0], mine[1], page, slots, has_prev, ratio, dim, new_rows=(new[0].double(), new[1], cur))


@pytest.mark.parametrize("ratio,dim,overlap", [(4, 128, True), (128, 512, False)])
def test_pool_windows_verify_rows_see_their_sequences_earlier_rows(ratio, dim, overlap):
    """An MTP verify step: each sequence brings 4 adjacent rows (consecutive positions, one state page), so a row's
    window holds the new rows of the same sequence's earlier rows, which this launch also stores. With back=3 the
    kernel takes those from the new rows, never racing their stores: the reference's write-all-then-pool result on
    every one of 20 launches (session 50: the model's multi-token steps differed from run to run before)."""
    from dsv4.kernels.cache_store import pool_windows, pool_windows_ref

    g = _gen(13 * ratio + dim)
    seqs, per = 8, 4
    width, rows, page, t, slots, has_prev, cur = _state_windows(g, seqs, ratio, dim, overlap, first_entry=False)
    cap = rows.shape[2]
    page = page.repeat_interleave(per)
    # one of each sequence's rows closes a window (only a closing row's pooled row is kept: the others' windows still
    # hold later positions, which the step pools too but sends to the trash page)
    close = (t // ratio + 2) * ratio - 1
    t = (close - torch.randint(0, per, (seqs,), generator=g, device=DEV)).repeat_interleave(per) \
        + torch.arange(per, device=DEV).repeat(seqs)
    closing = (t + 1) % ratio == 0
    first = (t // ratio) * ratio - (ratio if overlap else 0)
    slots = (first[:, None] + torch.arange((2 if overlap else 1) * ratio, device=DEV)[None, :]).clamp(min=0) % cap
    has_prev, cur = t >= ratio, t % cap
    new = (torch.randn(seqs * per, width, generator=g, device=DEV) * 3,
           torch.randn(seqs * per, width, generator=g, device=DEV))
    ref = rows.clone()
    want = pool_windows_ref(ref[0], ref[1], page, slots, has_prev, ratio, dim, new_rows=(*new, cur))
    # the test means something: some rows' windows hold an earlier row's slot
    earlier = [bool((slots[b] == cur[b - k]).any()) for b in range(len(t)) for k in range(1, per) if b % per >= k
               and closing[b]]
    assert sum(closing) == seqs and any(earlier)
    for launch in range(20 if DEV == "cuda" else 1):
        mine = rows.clone()
        got = pool_windows(mine[0], mine[1], page, slots, has_prev, ratio, dim, new_rows=(*new, cur), back=per - 1)
        assert torch.equal(mine, ref), f"launch {launch}: state rows"
        torch.testing.assert_close(got[closing], want[closing], rtol=2e-6, atol=2e-6,
                                   msg=lambda m: f"launch {launch}: {m}")


@pytest.mark.parametrize("ratio,dim,overlap,kind", [(4, 512, True, "main"), (128, 512, False, "main"),
                                                     (4, 128, True, "index")])
def test_pool_windows_stores_the_entries(ratio, dim, overlap, kind):
    """`store=` (attention.FUSED_ENTRY_STORE: the paged decode step's compressed entries stored by the pooling
    launch's last arriver per row): the pooled rows, the state rows and every entry-pool byte equal those of
    `pool_windows` followed by `store_rows` of its rows (norm, RoPE at the entry position; Hadamard + MXFP4 for
    the indexer's keys); a second launch over the same counters agrees too (the last arrivers left them zeroed)."""
    from dsv4.config import Rope
    from dsv4.kernels.cache_store import pool_windows, store_rows
    from dsv4.model.numerics import hadamard_matrix
    from dsv4.model.rope import RotaryEmbedding

    g = _gen(11 * ratio + dim)
    bsz = 5
    width, rows, page, t, slots, has_prev, cur = _state_windows(g, bsz, ratio, dim, overlap, first_entry=False)
    new = (torch.randn(bsz, width, generator=g, device=DEV) * 3, torch.randn(bsz, width, generator=g, device=DEV))
    pool = _pools("fp4" if kind == "index" else "fp8", 6, 16, g)
    e_page = torch.randint(0, 6, (bsz,), generator=g, device=DEV)
    e_off = torch.randperm(16, generator=g, device=DEV)[:bsz]
    cos, sin = RotaryEmbedding(64, Rope(theta=10000.0, yarn=None)).cos_sin((t // ratio) * ratio)
    kw = dict(norm_weight=(1 + 0.3 * torch.randn(dim, generator=g, device=DEV)).to(torch.bfloat16), eps=1e-6,
              cos=cos, sin=sin, hadamard=hadamard_matrix(dim, torch.float32, DEV) if kind == "index" else None)
    for launch in range(2):
        mine, ref = rows.clone(), rows.clone()
        want_pool, got_pool = _clone(pool), _clone(pool)
        want = pool_windows(ref[0], ref[1], page, slots, has_prev, ratio, dim, new_rows=(*new, cur))
        store_rows(want, e_page, e_off, want_pool, **kw)
        got = pool_windows(mine[0], mine[1], page, slots, has_prev, ratio, dim, new_rows=(*new, cur),
                           store=(e_page, e_off, got_pool, kw))
        assert torch.equal(got, want) and torch.equal(mine, ref)
        for name in ("q", "s") + (("rope",) if kind == "main" else ()):
            a, b = getattr(want_pool, name).view(torch.uint8), getattr(got_pool, name).view(torch.uint8)
            assert torch.equal(a, b), f"launch {launch}: entry pool {name} differs"
        assert not torch.equal(want_pool.q.view(torch.uint8), pool.q.view(torch.uint8)), "nothing was stored"
    with pytest.raises(ValueError, match="norm_weight"):
        pool_windows(rows[0], rows[1], page, slots, has_prev, ratio, dim, store=(e_page, e_off, pool, {}))


@pytest.mark.parametrize("ratio,dim,first,entry0,n", [(4, 128, 0, 0, 37), (4, 512, 8, 3, 20), (4, 128, 13, 5, 1),
                                                       (128, 512, 0, 0, 3), (128, 128, 256, 2, 2)])
def test_pool_chunk_matches_reference(ratio, dim, first, entry0, n):
    """`pool_chunk` (a prefill chunk's windows in one launch) vs `pool_chunk_ref`, which is `Compressor.pool`'s
    arithmetic (checked bit for bit), and a float64 softmax-weighted sum; entry 0 without a previous window."""
    from dsv4.kernels.cache_store import pool_chunk, pool_chunk_ref
    from dsv4.model.compressor import Compressor

    overlap = ratio == 4
    g = _gen(ratio + dim + first)
    rows = (entry0 + n) * ratio - first + 3  # a few rows of the next, open window
    c = torch.randn(rows, (2 if overlap else 1) * dim, generator=g, device=DEV) * 3
    z = torch.randn(rows, c.shape[1], generator=g, device=DEV)
    want = pool_chunk_ref(c, z, first, entry0, n, ratio, dim)
    comp = Compressor.__new__(Compressor)  # only `pool`'s fields
    comp.ratio, comp.dim, comp.overlap = ratio, dim, overlap
    torch_pool, i0 = Compressor.pool(comp, c, z, first, entry0 * ratio)
    assert i0 == entry0 and torch.equal(torch_pool[:n], want)
    got = pool_chunk(c, z, first, entry0, n, ratio, dim)
    assert got.shape == (n, dim) and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    e = n - 1  # float64 re-derivation of the last window
    lo = (entry0 + e) * ratio - first
    cw, zw = c[lo:lo + ratio].double(), z[lo:lo + ratio].double()
    if overlap:
        cw, zw = cw[:, dim:], zw[:, dim:]
        if entry0 + e > 0:
            cw = torch.cat((c[lo - ratio:lo, :dim].double(), cw))
            zw = torch.cat((z[lo - ratio:lo, :dim].double(), zw))
    torch.testing.assert_close(got[e].double(), (torch.softmax(zw, 0) * cw).sum(0), rtol=1e-5, atol=1e-5)
    # c and z as the two halves of one projection's rows (`Compressor.pool` passes them with their row stride)
    both = torch.cat((c, z), dim=1)
    c2, z2 = both[:, :c.shape[1]], both[:, c.shape[1]:]
    assert not c2.is_contiguous()
    assert torch.equal(pool_chunk(c2, z2, first, entry0, n, ratio, dim), got)
    assert torch.equal(Compressor.pool(comp, c2, z2, first, entry0 * ratio, fused=True)[0], got)
    # a later prompt chunk: the rows before `split` are in the state's ring (its own row stride, from row `start`
    # on, wrapping around its end or not), read where they are
    for split, start in ((1, 0), (rows // 2 + 1, 5), (rows - 1, 2)):
        cap = split + 3
        ring = torch.randn(cap, 3 * c.shape[1], generator=g, device=DEV)  # wider rows: the ring's own stride
        pc, pz = ring[:, :c.shape[1]], ring[:, c.shape[1]:2 * c.shape[1]]
        at = (start + torch.arange(split, device=DEV)) % cap
        pc[at], pz[at] = c[:split], z[:split]
        past = (pc, pz, start, split)
        assert torch.equal(pool_chunk(c2[split:], z2[split:], first, entry0, n, ratio, dim, past=past), got), split
        assert torch.equal(pool_chunk_ref(c[split:], z[split:], first, entry0, n, ratio, dim, past=past), want)
        for fused in (False, True):
            mine, i0 = Compressor.pool(comp, c2[split:], z2[split:], first, entry0 * ratio, fused=fused, past=past)
            assert i0 == entry0 and torch.equal(mine[:n], got if fused else torch_pool[:n]), (split, fused)


def test_pool_chunk_rejects_rows_that_miss_windows():
    from dsv4.kernels.cache_store import pool_chunk

    c = torch.randn(40, 256, device=DEV)
    with pytest.raises(RuntimeError, match="do not hold"):
        pool_chunk(c, c.clone(), 8, 1, 4, 4, 128)  # entry 1's previous window starts at 0 < 8
    with pytest.raises(RuntimeError, match="do not hold"):
        pool_chunk(c, c.clone(), 0, 0, 11, 4, 128)  # 44 rows needed
    with pytest.raises(ValueError, match="fp32"):
        pool_chunk(c.double(), c.double(), 0, 0, 2, 4, 128)
    with pytest.raises(RuntimeError, match="do not hold"):  # the past rows count: 8 + 32 < 44
        pool_chunk(c[8:], c[8:].clone(), 0, 0, 11, 4, 128, past=(c[:8], c[:8].clone(), 0, 8))
    with pytest.raises(ValueError, match="past ring"):
        pool_chunk(c, c.clone(), 0, 0, 2, 4, 128, past=(c[:8, :128], c[:8, 128:], 0, 8))
    with pytest.raises(ValueError, match="past ring"):
        pool_chunk(c, c.clone(), 0, 0, 2, 4, 128, past=(c[:8], c[:8].clone(), 0, 9))


@pytest.mark.parametrize("fused_pool", [False, True])
@pytest.mark.parametrize("kind", ["main", "index"])
def test_prefill_chunk_fused_store_matches_torch_finish(kind, fused_pool, monkeypatch):
    """`Compressor.update(fused=True)` (kernel-mode prefill: the entries a chunk completes go through
    `store_rows` with the compressor's norm, RoPE at i*r and, for indexer keys, the Hadamard) reads back from the
    paged FP8 / FP4 pool as the torch `finish` + quantise path's entries do: the same entries (count, order,
    positions), equal up to rare one-step flips (the RMS sum runs in another order; the interpreter truncates to
    bf16 where the GPU rounds)."""
    from dsv4.checkpoint.writer import tiny_config
    from dsv4.engine.cache import CacheConfig, HybridCache
    from dsv4.engine.sequence import Sequence
    from dsv4.model import compressor
    from dsv4.model.compressor import Compressor
    from dsv4.model.numerics import NUMERICS
    from dsv4.model.rope import RotaryEmbedding

    monkeypatch.setattr(compressor, "FUSED_POOL", fused_pool)  # the pooling too: `cache_store.pool_chunk`
    cfg = tiny_config()
    spec = next(s for s in cfg.layers if s.has_indexer)  # a CSA layer: ratio 4, overlapping windows
    dim = cfg.head_dim if kind == "main" else cfg.index_head_dim
    rope = RotaryEmbedding(cfg.rope_dim, spec.rope, torch.float32)
    comp = Compressor(cfg, spec.compress_ratio, dim, rope, torch.bfloat16, NUMERICS["reference"], kind).to(DEV)
    g = _gen(len(kind))
    comp.norm.weight.data = (1 + 0.3 * torch.randn(dim, generator=g, device=DEV)).to(torch.bfloat16)
    n = 4 * 37 + 2  # 37 windows close, the last one stays open
    c = torch.randn(n, 2 * dim, generator=g, device=DEV) * 2
    z = torch.randn(n, 2 * dim, generator=g, device=DEV)
    got = []
    for fused in (False, True):
        cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=1, max_model_len=512, kv_dtype="fp8"),
                            dtype=torch.bfloat16, device=DEV)
        state = cache.reserve(Sequence("r0", [1]), n).layers[spec.index]
        assert state.stores_fused(kind)
        comp.update(state, c, z, torch.bfloat16, fused=fused)
        assert state.num_entries(kind) == n // 4
        assert torch.equal(state.entries(kind, fused=True), state.entries(kind))  # the one-launch read
        got.append(state.entries(kind).float())
    want, have = got
    assert torch.isfinite(want).all() and want.abs().amax() > 0
    quantised = dim - cfg.rope_dim if kind == "main" else dim  # (main: the rope dims are stored in bf16)
    diff = float((have[:, :quantised] != want[:, :quantised]).double().mean())
    rel = float((have - want).norm() / want.norm())
    assert diff < (0.1 if INTERP else 0.01) and rel < (0.1 if INTERP else 1e-2), (diff, rel)


@pytest.mark.parametrize("kind", ["fp8", "fp4"])
def test_load_rows_matches_pool_read(kind):
    """`load_rows` (a prefill chunk's window / entry reads in one launch) dequantises slots of a pool filled with
    random bytes (every e4m3 / e2m1 code, E8M0 bytes 0 and 255 included) exactly as the torch `read` does."""
    from dsv4.kernels.cache_store import load_rows, load_rows_ref

    g = _gen(41 if kind == "fp8" else 43)
    pages, ps = 6, 16
    pool = _pools(kind, pages, ps, g)
    page = torch.randint(0, pages, (37,), generator=g, device=DEV)
    off = torch.randint(0, ps, (37,), generator=g, device=DEV)
    got, want = load_rows(page, off, pool), load_rows_ref(page, off, pool)
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape == (37, pool.width)
    assert torch.isfinite(want).float().mean() > 0.5  # (NaN only where a random scale byte is 255)
    keep = torch.ones_like(want, dtype=torch.bool)
    if INTERP:  # bf16 subnormals (scale bytes near 0): the interpreter truncates where the GPU and torch round
        keep = (got == want) | ((want.float().abs() >= 2.0 ** -120) & (got.float().abs() >= 2.0 ** -120))
    torch.testing.assert_close(got[keep], want[keep], rtol=0, atol=0, equal_nan=True)
    assert load_rows(page[:0], off[:0], pool).shape == (0, pool.width)
    # a chunk's own rows after the pool's (the window's keys, then the chunk's): copied by the same launch
    wide = torch.randn(9, 2 * pool.width, generator=g, device=DEV).to(torch.bfloat16)
    tail = wide[:, 3:3 + pool.width]  # (a row stride of its own)
    both = load_rows(page, off, pool, tail=tail)
    assert both.shape == (37 + 9, pool.width) and torch.equal(both[37:], tail)
    assert torch.equal(both[:37].view(torch.int16), got.view(torch.int16))
    assert torch.equal(load_rows_ref(page, off, pool, tail=tail)[37:], tail)
    assert torch.equal(load_rows(page[:0], off[:0], pool, tail=tail), tail)
    with pytest.raises(ValueError, match="tail"):
        load_rows(page, off, pool, tail=tail.float())


@pytest.mark.parametrize("fused", [False, True])
def test_later_chunk_pools_from_the_state_ring(fused, monkeypatch):
    """A prompt in two chunks through a paged CSA layer's two compressors (`Compressor.update` with the state's
    ring as `past`; kernel mode: `pool_chunk(past=)` reads the ring where it is) stores the same entries, bit for
    bit, as the whole prompt in one chunk (no past); the second chunk's windows straddle the chunk boundary."""
    from dsv4.checkpoint.writer import tiny_config
    from dsv4.engine.cache import CacheConfig, HybridCache
    from dsv4.engine.sequence import Sequence
    from dsv4.model import compressor
    from dsv4.model.compressor import Compressor
    from dsv4.model.numerics import NUMERICS
    from dsv4.model.rope import RotaryEmbedding

    pasts = []
    real = compressor.pool_chunk
    monkeypatch.setattr(compressor, "pool_chunk", lambda *a, past=None: pasts.append(past) or real(*a, past=past))
    cfg = tiny_config()
    spec = next(s for s in cfg.layers if s.has_indexer)
    rope = RotaryEmbedding(cfg.rope_dim, spec.rope, torch.float32)
    g = _gen(63)
    comps, rows = {}, {}
    n, split = 4 * 23 + 2, 4 * 9 + 3  # the second chunk's first window takes 1 row of the first chunk
    for kind, dim in (("main", cfg.head_dim), ("index", cfg.index_head_dim)):
        comps[kind] = Compressor(cfg, spec.compress_ratio, dim, rope, torch.bfloat16, NUMERICS["reference"],
                                 kind).to(DEV)
        comps[kind].norm.weight.data = (1 + 0.3 * torch.randn(dim, generator=g, device=DEV)).to(torch.bfloat16)
        rows[kind] = (torch.randn(n, 2 * dim, generator=g, device=DEV) * 2,
                      torch.randn(n, 2 * dim, generator=g, device=DEV))
    kv = torch.randn(n, cfg.head_dim, generator=g, device=DEV).to(torch.bfloat16)
    got = []
    for chunks in ([(0, n)], [(0, split), (split, n)]):
        cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=1, max_model_len=512, kv_dtype="fp8"),
                            dtype=torch.bfloat16, device=DEV)
        state = cache.reserve(Sequence("r0", [1]), n).layers[spec.index]
        for lo, hi in chunks:
            for kind, comp in comps.items():
                comp.update(state, rows[kind][0][lo:hi], rows[kind][1][lo:hi], torch.bfloat16, fused=fused)
            state.append_tokens(kv[lo:hi], {k: (c[lo:hi], z[lo:hi]) for k, (c, z) in rows.items()}, fused=fused)
        got.append({kind: state.entries(kind) for kind in comps})
    whole, parts = got
    for kind in comps:
        assert whole[kind].shape[0] == n // 4 and torch.isfinite(whole[kind].float()).all()
        assert torch.equal(parts[kind].view(torch.uint8), whole[kind].view(torch.uint8)), kind
    if fused:  # only the second chunk's two updates have a past: at least rows 32-38 (entry 9's windows)
        assert [p is None for p in pasts] == [True, True, True, True, False, False]
        assert all(7 <= p[3] <= split for p in pasts[4:])
