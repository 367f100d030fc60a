"""Host side of dsv4.kernels.grid_barrier (the barrier itself: tests/gpu/test_grid_barrier.py): how many programs
of a compiled kernel fit at once (Hopper: 64K registers allocated per warp in 256s, 228 KB of shared memory with 1
KB reserved per block, 64 warps, 32 blocks per SM), and one zeroed counter per (user, device, grid size)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from dsv4.kernels.grid_barrier import barrier_counter, resident_programs


def _kernel(regs: int, warps: int, shared: int):
    return SimpleNamespace(n_regs=regs, metadata=SimpleNamespace(num_warps=warps, shared=shared),
                           _init_handles=lambda: None)


def _fits(regs: int, warps: int, shared: int) -> int:
    """Blocks per SM, by brute force: add blocks until one limit is exceeded."""
    blocks = 0
    while True:
        b = blocks + 1
        reg_use = b * warps * (((regs * 32) + 255) // 256 * 256)
        if reg_use > 65536 or b * (shared + 1024) > 228 * 1024 or b * warps > 64 or b > 32:
            return blocks
        blocks = b


@pytest.mark.parametrize("seed", range(5))
def test_resident_programs_against_a_brute_force_count(seed):
    rng = random.Random(seed)
    for _ in range(200):
        regs, warps = rng.randint(8, 255), rng.choice([1, 2, 4, 8, 16])
        shared = rng.choice([0, rng.randint(0, 200 * 1024)])
        sms = rng.choice([1, 78, 132])
        assert resident_programs(_kernel(regs, warps, shared), sms) == sms * _fits(regs, warps, shared)


def test_known_figures():
    # the bench's chain kernel: 80 registers, 4 warps, no shared memory -> 6 per SM (2560 registers per warp)
    assert resident_programs(_kernel(80, 4, 0), 132) == 792
    assert resident_programs(_kernel(255, 8, 0), 132) == 132  # 8192 registers per warp: one block
    assert resident_programs(_kernel(32, 1, 0), 1) == 32  # the per-SM block limit
    assert resident_programs(_kernel(32, 4, 120 * 1024), 1) == 1  # shared memory


def test_one_zeroed_counter_per_user_device_and_grid_size():
    dev = torch.device("cpu")
    n = random.randint(100, 10_000)
    a = barrier_counter("test host", dev, n)
    assert a.dtype == torch.int64 and a.numel() == 1 and a.item() == 0
    a += 7  # a launch leaves it where its rounds ended; the same launches keep using it
    assert barrier_counter("test host", dev, n) is a and a.item() == 7
    assert barrier_counter("test host", dev, n + 1) is not a
    assert barrier_counter("another user", dev, n) is not a
