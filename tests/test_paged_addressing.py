"""Host-side addressing of the paged decode state: the largest ring slot of a position range is computed without
reading the slots back from the device (it must equal the brute-force maximum), and the slot lists the layers of a
sequence share within a step are the brute-force (page, offset) pairs of its current block table; the derivations
shared within one forward (entry positions, visible entry counts) equal their definitions."""
from __future__ import annotations

import random

import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.engine.cache import CacheConfig, HybridCache
from dsv4.engine.paged_state import largest_slot
from dsv4.engine.sequence import Sequence


def test_ring_slot_maximum_matches_brute_force():
    rnd = random.Random(5)
    for _ in range(3000):
        ring = rnd.choice([1, 2, 7, 132, 133])
        start = rnd.randrange(0, 1000)
        end = start + rnd.randrange(1, 2 * ring + 3)
        assert largest_slot(start, end, ring) == max(p % ring for p in range(start, end)), (ring, start, end)


def _brute(table: list[int], lo: int, hi: int, page_size: int, ring: int) -> tuple[list[int], list[int]]:
    index = [p % ring if ring else p for p in range(lo, hi)]
    return [table[i // page_size] for i in index], [i % page_size for i in index]


def test_slot_lists_are_shared_by_the_layers_and_follow_the_table():
    from dsv4.model.rope import shared_cos_sin

    cfg = tiny_config("fp4", "csa,csa,hca,csa", index_topk=8)
    cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=3, max_model_len=512, kv_dtype="fp8"),
                        dtype=torch.float32, device="cpu")
    seqs = [Sequence(f"r{i}", [1]) for i in range(3)]
    rnd = random.Random(7)
    for seq in seqs:  # interleaved, so the sequences' pages are not one run of ids
        cache.reserve(seq, rnd.randrange(40, 120))
    ring = cache.pools.ring
    for seq in seqs:
        csa = [s for s in cache.state_of(seq).layers if s.ratio == 4]
        for kind, page_size, r in (("window", cache.pools.window[0].page_size, ring),
                                   ("compressed4", cache.pools.entries[0, "main"].page_size, 0)):
            lo = rnd.randrange(0, 30)
            hi = lo + rnd.randrange(1, 2 * ring + 3 if r else 8)
            want = _brute(seq.block_tables[kind], lo, hi, page_size, r)
            with shared_cos_sin():  # one forward's scope
                first = csa[0]._slots(kind, lo, hi, page_size, r)
                again = csa[1]._slots(kind, lo, hi, page_size, r)
                assert again[0] is first[0] and again[1] is first[1]  # derived once for the layers
                assert (first[0].tolist(), first[1].tolist()) == want, (kind, lo, hi)
                # the table changes (pages reassigned): the next ask derives from the new one
                seq.block_tables[kind] = list(reversed(seq.block_tables[kind]))
                moved = csa[2]._slots(kind, lo, hi, page_size, r)
                assert (moved[0].tolist(), moved[1].tolist()) == _brute(seq.block_tables[kind], lo, hi, page_size, r)
                assert moved[0].tolist() != first[0].tolist() or len(set(want[0])) == 1
                seq.block_tables[kind] = list(reversed(seq.block_tables[kind]))
            later = csa[0]._slots(kind, lo, hi, page_size, r)  # the next forward derives its own
            assert later[0] is not first[0] and (later[0].tolist(), later[1].tolist()) == want


def test_forward_scoped_derivations_are_shared_and_exact():
    """The compressors' entry positions and the indexer's visible counts: inside one forward's scope one tensor per
    range / positions view (equal to its definition), outside it a fresh one each call."""
    from dsv4.model.indexer import visible_entries
    from dsv4.model.rope import shared_cos_sin, strided_positions

    rnd = random.Random(11)
    positions = torch.arange(rnd.randrange(0, 500), 700)
    for _ in range(50):
        ratio, a = rnd.choice([4, 128]), rnd.randrange(0, 100)
        b = a + rnd.randrange(1, 100)
        view = positions[a:b]
        with shared_cos_sin():
            seen = visible_entries(view, ratio)
            assert visible_entries(positions[a:b], ratio) is seen
            assert torch.equal(seen, torch.tensor([(int(p) + 1) // ratio for p in view], dtype=torch.int32))
            other = visible_entries(positions[a + 1:b], ratio)  # another view: its own counts
            assert other is not seen and torch.equal(other, ((positions[a + 1:b] + 1) // ratio).to(torch.int32))
            ent = strided_positions(a * ratio, b * ratio, ratio, "cpu")
            assert strided_positions(a * ratio, b * ratio, ratio, "cpu") is ent
            assert ent.tolist() == [i * ratio for i in range(a, b)]
        assert visible_entries(view, ratio) is not visible_entries(view, ratio)
        assert strided_positions(0, 8, 4, "cpu") is not strided_positions(0, 8, 4, "cpu")


def test_flag_off_derives_per_layer(monkeypatch):
    """rope.SHARE_ACROSS_LAYERS = False (the A/B's other arm): each ask derives its own lists, of the same values."""
    from dsv4.model import rope
    from dsv4.model.indexer import visible_entries

    cfg = tiny_config("fp4", "csa,csa", index_topk=8)
    cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=1, max_model_len=256, kv_dtype="fp8"),
                        dtype=torch.float32, device="cpu")
    seq = Sequence("r0", [1])
    cache.reserve(seq, 90)
    a, b = cache.state_of(seq).layers
    ps = cache.pools.window[0].page_size
    monkeypatch.setattr(rope, "SHARE_ACROSS_LAYERS", False)
    positions = torch.arange(5, 60)
    with rope.shared_cos_sin():
        one = a._slots("window", 3, 40, ps, cache.pools.ring)
        own = b._slots("window", 3, 40, ps, cache.pools.ring)
        assert own[0] is not one[0] and torch.equal(own[0], one[0]) and torch.equal(own[1], one[1])
        assert visible_entries(positions, 4) is not visible_entries(positions, 4)
