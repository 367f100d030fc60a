"""Host-side addressing of the paged decode state: the largest ring slot of a position range is
computed without reading the slots back from the device; it must equal the brute-force maximum."""
from __future__ import annotations

import random
from types import SimpleNamespace

import torch

from dsv4.engine.paged_state import PagedLayerState


def test_ring_slot_maximum_matches_brute_force():
    rnd = random.Random(5)
    for _ in range(3000):
        ring = rnd.choice([1, 2, 7, 132, 133])
        start = rnd.randrange(0, 1000)
        end = start + rnd.randrange(1, 2 * ring + 3)
        fake = SimpleNamespace(pools=SimpleNamespace(ring=ring, device=torch.device("cpu")))
        slots, top = PagedLayerState._ring_slots(fake, start, end)
        assert slots.tolist() == [p % ring for p in range(start, end)]
        assert top == max(p % ring for p in range(start, end)), (ring, start, end)
