"""Shared cache pages (BlockManager.share): forks of a prefix (prompt sharing, prefix snapshots) hold the source's
full pages of final compressed entries / indexer keys instead of copies.

References: a holder-counting model of the pools written here (sets of holders per page), a brute-force count of
final pages from the entry rule (entry e is complete once r * (e + 1) tokens are computed), and engines that share
nothing (every prompt computed) for the outputs. The engine tests also check what makes sharing safe: a page is
never written while several hold it (its bytes in every layer's pools are as they were when it was first shared),
also under speculative decoding with a random MTP head (most drafts rejected, so states roll back every step)."""
from __future__ import annotations

import random

import pytest
import torch

from dsv4.engine.block_manager import BlockManager, PageHolder, PageKind
from dsv4.engine.cache import CacheConfig
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams
from _spec_decode_helpers import MAX_LEN as SPEC_LEN, build_model
from dsv4.checkpoint.writer import random_master_weights
from test_engine import CFG, MAX_LEN, assert_all_pages_free, ckpt, drain, model  # noqa: F401  (fixtures)
from test_prompt_sharing import tokens
from test_retention import greedy
from test_spec_decode import CFG as SPEC_CFG

SMALL_PAGES = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}


# ---- the block manager -----------------------------------------------------------------------

def kinds(num_pages: int) -> list[PageKind]:
    return [PageKind("window", 4, num_pages, ratio=1, ring=12), PageKind("compressed4", 3, num_pages, ratio=4),
            PageKind("compressed128", 2, num_pages, ratio=128), PageKind("state", 1, num_pages, ratio=0)]


@pytest.mark.parametrize("kind", kinds(1), ids=lambda k: k.name)
def test_final_pages_match_the_entry_rule(kind):
    for n in range(0, 900):
        if kind.ratio == 0 or kind.ring:
            want = 0  # rewritten as the sequence goes on: never shared
        else:
            complete = {e for e in range(n) if kind.ratio * (e + 1) <= n}
            want = sum(1 for p in range(n) if all(e in complete for e in range(p * kind.page_size,
                                                                                   (p + 1) * kind.page_size)))
        assert kind.final_pages(n) == want, (kind.name, n)


def test_holder_counts_against_a_model():
    """Random allocations, shares and frees over several holders: each page's holder count, the free counts and
    the free lists agree with sets of holders per page; a page returns to its pool with its last holder."""
    rng = random.Random(5)
    bm = BlockManager(kinds(40))
    holders: list[PageHolder] = []
    names, most_shared = iter(range(10 ** 6)), 0
    for _ in range(600):
        op = rng.random()
        if op < 0.35 or not holders:
            h = PageHolder(f"h{next(names)}")
            n = rng.randrange(1, 400)
            if bm.can_allocate(h, n):
                bm.allocate(h, n)
                h.num_computed_tokens = n
                holders.append(h)
        elif op < 0.7:
            src = rng.choice(holders)
            h = PageHolder(f"h{next(names)}")
            final = rng.randrange(0, src.num_computed_tokens + 1)
            shared = bm.share(h, src.block_tables, final)
            for name, n in shared.items():
                assert h.block_tables[name] == src.block_tables[name][:n]
            assert set(shared) <= {"compressed4", "compressed128"}
            n = rng.randrange(final, final + 200)
            if bm.can_allocate(h, n):
                bm.allocate(h, n)
                h.num_computed_tokens = n
            else:
                assert n > final
            holders.append(h)
        else:
            bm.free(holders.pop(rng.randrange(len(holders))))
        for name, pool in bm.pools.items():
            holding: dict[int, int] = {}
            for h in holders:
                for page in h.block_tables.get(name, ()):
                    holding[page] = holding.get(page, 0) + 1
            assert pool.refs == holding, name
            assert sorted(pool.free_ids) == sorted(set(range(40)) - set(holding)), name
            assert pool.num_shared == sum(1 for n in holding.values() if n > 1)
        most_shared = max(most_shared, bm.num_shared())
    assert most_shared > 5  # (not a run of lone holders)
    while holders:
        bm.free(holders.pop())
    assert all(bm.num_free(k) == 40 for k in bm.kinds) and bm.num_shared() == 0


def test_share_errors_change_nothing():
    bm = BlockManager(kinds(20))
    a, b = PageHolder("a"), PageHolder("b")
    bm.allocate(a, 100)
    bm.allocate(b, 10)
    before = {name: dict(p.refs) for name, p in bm.pools.items()}
    with pytest.raises(ValueError, match="empty block table"):
        bm.share(b, a.block_tables, 100)  # b already holds compressed4 pages
    stale = PageHolder("stale", {"compressed4": [17, 18]})
    with pytest.raises(ValueError, match="not all in use"):
        bm.share(PageHolder("c"), stale.block_tables, 100)
    assert {name: dict(p.refs) for name, p in bm.pools.items()} == before
    bm.free(a)
    with pytest.raises(ValueError, match="freed twice"):
        bm.free(PageHolder("again", {"compressed4": [0]}))  # a's first page


# ---- the engine ------------------------------------------------------------------------------

def pool_tensors(engine) -> dict[str, list[tuple[torch.Tensor, int]]]:
    """Every tensor holding a page of each kind, with the page dimension (as PagedPools.copy_pages addresses them)."""
    pools, out = engine.cache.pools, {}
    for pool in pools.window.values():
        out.setdefault("window", []).extend((t, 0) for t in pool.tensors())
    for (layer, name), pool in pools.entries.items():
        ratio = engine.config.layer(layer).compress_ratio
        out.setdefault(f"compressed{ratio}" if name == "main" else "indexer4", []).extend(
            (t, 0) for t in pool.tensors())
    for buf in pools.rows.values():
        out.setdefault("state", []).append((buf, 1))
    return out


def watch_shared_pages(engine) -> dict:
    """Record each page's bytes when it is shared; after every step, check that every page still held by several
    holders has them. Returns counters: the most pages shared at once, and the pages checked."""
    bm, tensors, seen, counts = engine.block_manager, pool_tensors(engine), {}, {"peak": 0, "checked": 0}

    def snap(kind: str, page: int) -> list[torch.Tensor]:
        return [t.select(dim, page).clone() for t, dim in tensors[kind]]

    share = bm.share

    def sharing(seq, block_tables, num_final_tokens):
        shared = share(seq, block_tables, num_final_tokens)
        for kind, n in shared.items():
            for page in seq.block_tables[kind][:n]:
                seen.setdefault((kind, page), snap(kind, page))
        return shared

    bm.share, step = sharing, engine.step

    def checked_step():
        out = step()
        held = {(kind, page) for kind, pool in bm.pools.items() for page, n in pool.refs.items() if n > 1}
        for key in list(seen):
            if key not in held:
                del seen[key]  # one holder left: it may write the page again
                continue
            assert all(torch.equal(a, b) for a, b in zip(seen[key], snap(*key))), f"shared page {key} was written"
            counts["checked"] += 1
        assert engine.stats().shared_pages == len(held)
        counts["peak"] = max(counts["peak"], len(held))
        return out

    engine.step = checked_step
    return counts


def small_cache(max_num_seqs: int, **kw) -> CacheConfig:
    return CacheConfig.for_capacity(CFG, max_num_seqs=max_num_seqs, max_model_len=MAX_LEN, page_sizes=SMALL_PAGES,
                                    kept_states=2, **kw)


@pytest.mark.parametrize("overlap,kv_dtype", [(False, "auto"), (True, "fp8")])
def test_forks_of_a_snapshot_share_its_pages(model, overlap, kv_dtype):  # noqa: F811
    """A 200-token system prompt, then five requests with it at once: the second request's snapshot at 192 tokens
    is final up to 188 (4 tokens of rollback), i.e. 47 ratio-4 entries: 11 full pages of 4 compressed entries and 11
    of indexer keys, and one ratio-128 entry page: 23 pages, held once however many forks run. Greedy tokens as an
    engine sharing nothing computes them; no shared page is written; all pages come back."""
    rng = random.Random(11)
    system = tokens(rng, 200)
    waves = [[("first", system + tokens(rng, 6), 5)],
             [(f"q{i}", system + tokens(rng, rng.randrange(3, 20)), rng.randrange(6, 14)) for i in range(5)]]
    results = {}
    for share in (False, True):
        ec = EngineConfig(max_num_seqs=6, max_num_batched_tokens=256, max_model_len=MAX_LEN, overlap=overlap,
                          cache=small_cache(6), share_prompts=share, prefix_snapshots=2 if share else 0,
                          kv_dtype=kv_dtype)
        engine = LLMEngine(model, model.config, None, ec)
        counts = watch_shared_pages(engine)
        results[share] = {}
        for wave in waves:
            for rid, prompt, n in wave:
                engine.add_request(rid, prompt, greedy(n))
            results[share].update({k: v["tokens"] for k, v in drain(engine).items()})
        if share:
            s = engine.stats()
            assert (s.snapshots_taken, s.num_forks) == (1, 4)
            assert counts["peak"] == 11 + 11 + 1 and counts["checked"] > 0
            engine.snapshots.clear()
        assert_all_pages_free(engine)
    assert results[True] == results[False]


def test_n_choices_share_the_prompt_pages(model):  # noqa: F811
    """Four requests of one 150-token prompt (seeded sampling): the three forks of the first one, taken when it has
    computed the prompt (final to 146: 36 ratio-4 entries, 9 pages of each ratio-4 kind, one ratio-128 page), share
    19 pages with it; the outputs are those of an engine sharing nothing, and fewer pages are in use at the peak."""
    prompt = tokens(random.Random(13), 150)
    peaks, results = {}, {}
    for share in (False, True):
        ec = EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=MAX_LEN, cache=small_cache(4),
                          share_prompts=share)
        engine = LLMEngine(model, model.config, None, ec)
        counts = watch_shared_pages(engine)
        used, step = [], engine.step

        def counted(step=step, engine=engine, used=used):
            out = step()
            s = engine.stats()
            used.append(s.total_pages - s.free_pages)
            return out
        engine.step = counted
        for j in range(4):
            engine.add_request(f"s{j}", prompt, SamplingParams(temperature=0.8, max_tokens=12, seed=j, ignore_eos=True))
        results[share] = {k: v["tokens"] for k, v in drain(engine).items()}
        peaks[share] = max(used)
        if share:
            assert engine.stats().num_forks == 3 and counts["peak"] == 9 + 9 + 1 and counts["checked"] > 0
        assert_all_pages_free(engine)
    assert results[True] == results[False]
    assert peaks[True] <= peaks[False] - 3 * 19 + 3  # (the forks' last partial pages may differ by one per fork)


def test_shared_pages_under_speculative_decoding():
    """MTP drafts from a random head (most rejected: the states roll back every step) on forks of a snapshot and of
    running sequences: no shared page is written, and the greedy tokens are those of an engine without speculation
    or sharing."""
    model = build_model(SPEC_CFG, random_master_weights(SPEC_CFG, seed=61))
    rng = random.Random(17)
    system = [rng.randrange(2, SPEC_CFG.vocab_size) for _ in range(100)]
    asks = [system + [rng.randrange(2, SPEC_CFG.vocab_size) for _ in range(rng.randrange(2, 9))] for _ in range(6)]
    cache = CacheConfig.for_capacity(SPEC_CFG, max_num_seqs=4, max_model_len=SPEC_LEN, page_sizes=SMALL_PAGES,
                                     kept_states=2)
    runs = []
    for spec in (False, True):
        ec = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=SPEC_LEN, cache=cache,
                          speculative="mtp" if spec else None, num_draft_tokens=3, share_prompts=spec,
                          prefix_snapshots=2 if spec else 0)
        engine = LLMEngine(model, model.config, None, ec)
        counts = watch_shared_pages(engine)
        out = {}
        for j, prompt in enumerate(asks):
            engine.add_request(f"q{j}", prompt, greedy(10))
            if j % 2:
                out.update({k: v["tokens"] for k, v in drain(engine).items()})
        out.update({k: v["tokens"] for k, v in drain(engine).items()})
        runs.append(out)
        if spec:
            s = engine.stats()
            assert s.num_forks >= 3 and s.spec_draft_tokens > 0 and counts["peak"] > 0 and counts["checked"] > 0
            engine.snapshots.clear()
        assert_all_pages_free(engine)
    assert runs[1] == runs[0]
