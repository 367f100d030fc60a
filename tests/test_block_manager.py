import random

import pytest

from dsv4.config import ModelConfig
from dsv4.engine.block_manager import (BlockManager, OutOfPages, PageKind, make_page_kinds, pages_needed,
                                       required_kinds)
from dsv4.engine.sequence import Sequence

CONFIGS = "/work/shared/fixtures/configs"


def brute_pages(n: int, ratio: int, page: int, ring: int) -> int:
    """Count the distinct pages touched by every slot a sequence of n computed tokens has written."""
    if n == 0:
        return 0
    if ratio == 0:
        return 1
    if ring:
        slots = {p % ring for p in range(n)}
    else:
        slots = {e for e in range(n) if (e + 1) * ratio <= n}  # entry e complete once token r*e+r-1 is in
    return len({s // page for s in slots})


@pytest.mark.parametrize("ratio,page,ring", [(4, 1, 0), (4, 3, 0), (4, 16, 0), (128, 2, 0), (128, 1, 0),
                                             (1, 16, 128), (1, 5, 128), (1, 128, 128), (1, 3, 8), (0, 1, 0)])
def test_pages_needed_matches_brute_force(ratio, page, ring):
    for n in range(0, 700):
        assert pages_needed(n, ratio, page, ring) == brute_pages(n, ratio, page, ring), n


def test_required_kinds_follow_layer_schedule():
    flash = ModelConfig.from_file(f"{CONFIGS}/deepseek-v4-flash.config.json")
    pro = ModelConfig.from_file(f"{CONFIGS}/deepseek-v4-pro.config.json")
    full = ("window", "compressed4", "indexer4", "compressed128", "state")
    assert required_kinds(flash.compress_ratios) == full
    assert required_kinds(pro.compress_ratios) == full
    assert required_kinds([0, 0, 0]) == ("window",)
    assert required_kinds([0, 128, 0]) == ("window", "compressed128", "state")
    assert required_kinds([4, 0]) == ("window", "compressed4", "indexer4", "state")


def test_make_page_kinds_and_errors():
    sizes = {"window": 16, "compressed4": 8, "indexer4": 32, "compressed128": 2}
    counts = {"window": 10, "compressed4": 11, "indexer4": 12, "compressed128": 13, "state": 14}
    kinds = {k.name: k for k in make_page_kinds([0, 4, 128, 0], 128, sizes, counts)}
    assert kinds["window"].ring == 128 and kinds["window"].ratio == 1
    assert kinds["indexer4"].ratio == 4 and kinds["indexer4"].page_size == 32
    assert kinds["compressed128"].ratio == 128 and kinds["compressed128"].num_pages == 13
    assert kinds["state"].pages_needed(1000) == 1
    with pytest.raises(ValueError, match="indexer4"):
        make_page_kinds([4], 128, {"window": 16, "compressed4": 8}, counts)
    with pytest.raises(ValueError, match="state"):
        make_page_kinds([4], 128, sizes, {k: v for k, v in counts.items() if k != "state"})
    with pytest.raises(ValueError, match="page_size"):
        PageKind("window", 0, 4, ratio=1, ring=8)


def small_kinds(num_pages: int) -> list[PageKind]:
    return make_page_kinds([0, 4, 16], 8, {"window": 3, "compressed4": 2, "indexer4": 5, "compressed16": 1},
                           {"window": num_pages, "compressed4": num_pages, "indexer4": num_pages,
                            "compressed16": num_pages, "state": max(num_pages // 4, 1)})


def test_random_allocation_invariants():
    rng = random.Random(7)
    bm = BlockManager(small_kinds(24))
    live: list[Sequence] = []
    for step in range(3000):
        op = rng.random()
        if op < 0.15 or not live:
            s = Sequence(f"r{step}", [rng.randrange(50) for _ in range(rng.randrange(1, 10))])
            live.append(s)
        elif op < 0.25:
            s = live.pop(rng.randrange(len(live)))
            bm.free(s)
            assert s.block_tables == {}
        else:
            s = rng.choice(live)
            n = rng.randrange(1, 12)
            before = {k: list(v) for k, v in s.block_tables.items()}
            free_before = {k: bm.num_free(k) for k in bm.kinds}
            if bm.can_allocate(s, n):
                bm.allocate(s, n)
                s.num_computed_tokens += n
            else:
                with pytest.raises(OutOfPages):
                    bm.allocate(s, n)
                assert {k: v for k, v in s.block_tables.items()} == before  # all or nothing
                assert {k: bm.num_free(k) for k in bm.kinds} == free_before
        # Invariants: tables sized exactly, no page owned twice, free + owned = capacity.
        for kind in bm.kinds.values():
            owned = [p for q in live for p in q.block_tables.get(kind.name, [])]
            assert len(owned) == len(set(owned))
            assert len(owned) + bm.num_free(kind.name) == kind.num_pages
            assert all(0 <= p < kind.num_pages for p in owned)
            for q in live:
                assert len(q.block_tables.get(kind.name, [])) == kind.pages_needed(q.num_computed_tokens)
            assert bm.usage()[kind.name] == pytest.approx(len(owned) / kind.num_pages)
    for s in live:
        bm.free(s)
    assert all(bm.num_free(k.name) == k.num_pages for k in bm.kinds.values())


def test_window_ring_reuses_pages_and_locate_is_injective():
    kinds = {k.name: k for k in small_kinds(64)}
    bm = BlockManager(kinds.values())
    s = Sequence("a", [1] * 5)
    seen_window_tables = set()
    for n in range(1, 60):
        bm.allocate(s, 1)
        s.num_computed_tokens += 1
        win = kinds["window"]
        seen_window_tables.add(tuple(s.block_tables["window"]))
        # The last min(n, 8) positions map to distinct slots inside the sequence's own pages.
        slots = [win.locate(s.block_tables["window"], p) for p in range(max(0, n - 8), n)]
        # Contract with the cache: position p lives in ring slot p mod window, slots paged in order.
        assert slots == [(s.block_tables["window"][(p % 8) // 3], (p % 8) % 3) for p in range(max(0, n - 8), n)]
        assert len(set(slots)) == len(slots)
        assert all(pg in s.block_tables["window"] and off < win.page_size for pg, off in slots)
        for name in ("compressed4", "indexer4", "compressed16"):
            k = kinds[name]
            entries = [k.locate(s.block_tables[name], e) for e in range(n // k.ratio)]
            assert entries == [(s.block_tables[name][e // k.page_size], e % k.page_size) for e in range(n // k.ratio)]
            assert len(set(entries)) == len(entries)
            assert all(pg in s.block_tables[name] for pg, _ in entries)
    assert len(s.block_tables["window"]) == 3  # ceil(8 / 3), never more
    assert len(seen_window_tables) == 3        # grew twice, then only reused
    bm.free(s)


def test_double_free_and_fits_alone():
    bm = BlockManager(small_kinds(4))
    s = Sequence("a", [1, 2, 3])
    bm.allocate(s, 3)
    tables = {k: list(v) for k, v in s.block_tables.items()}
    bm.free(s)
    s.block_tables = tables
    with pytest.raises(ValueError, match="freed twice"):
        bm.free(s)
    # compressed4 holds 4 pages x 2 entries = 8 entries = 32 tokens (33..35 would need a 5th page).
    assert bm.fits_alone(35) and not bm.fits_alone(36)
