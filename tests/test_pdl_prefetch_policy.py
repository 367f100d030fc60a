"""Which PDL kernels start their weights into L2 before their wait (dsv4.kernels._triton): only weights up to
PREFETCH_MAX_BYTES (measured in session 23: the prefetch helps a 1 MB linear and slows a 4.2 MB or 16.8 MB one
in a chain of dependent launches), and none with PDL off."""

from __future__ import annotations

import random

from dsv4.kernels import _triton


def test_prefetch_only_up_to_the_size_limit(monkeypatch):
    monkeypatch.setattr(_triton, "PDL", True)
    limit = _triton.PREFETCH_MAX_BYTES
    assert 1 << 20 <= limit < 4 << 20  # the measured sizes: 1 MB gains, 4.2 MB loses
    small = random.randint(1, limit)
    big = random.randint(limit + 1, 64 << 20)
    assert _triton.weight_prefetch_kblocks(small) == _triton.PREFETCH_KBLOCKS > 0
    assert _triton.weight_prefetch_kblocks(limit) == _triton.PREFETCH_KBLOCKS
    assert _triton.weight_prefetch_kblocks(limit + 1) == 0
    assert _triton.weight_prefetch_kblocks(big) == 0
    monkeypatch.setattr(_triton, "PREFETCH_MAX_BYTES", big)  # the bench's A/B knob
    assert _triton.weight_prefetch_kblocks(big) == _triton.PREFETCH_KBLOCKS


def test_no_prefetch_without_pdl(monkeypatch):
    monkeypatch.setattr(_triton, "PDL", False)
    assert _triton.weight_prefetch_kblocks(random.randint(1, 1 << 20)) == 0
