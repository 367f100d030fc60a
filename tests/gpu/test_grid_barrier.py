"""The grid barrier of persistent kernels (dsv4.kernels.grid_barrier): in every round each program publishes a
fresh value, meets the others, reads a different program's value each round, and meets them again before it
overwrites its own. A barrier that lets one program through early shows up as a stale value."""

from __future__ import annotations

import pytest
import torch

from dsv4.kernels._triton import INTERPRET

if INTERPRET:
    pytest.skip("a spin barrier needs all programs resident (the interpreter runs them one at a time)",
                allow_module_level=True)

triton = pytest.importorskip("triton")
tl = triton.language

from dsv4.kernels.grid_barrier import barrier_counter, grid_barrier, resident_programs  # noqa: E402


@triton.jit
def _exchange_kernel(SLOT, ERR, CNT, SEED, ROUNDS: tl.constexpr, SPIN: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    errors = 0
    for r in range(ROUNDS):
        # programs reach the barrier at different times: a pid- and round-dependent busy loop
        delay = (pid * 7919 + r * 104729 + tl.load(SEED)) % SPIN
        acc = pid
        for _ in range(delay):
            acc = (acc * 1103515245 + 12345) % 2147483647
        tl.store(ERR + pid, acc)  # keeps the loop (overwritten at the end)
        tl.store(SLOT + pid, r * nprog + pid)
        grid_barrier(CNT)
        other = (pid + 1 + r * 13) % nprog
        got = tl.load(SLOT + other, cache_modifier=".cg")
        errors += (got != r * nprog + other).to(tl.int32)
        grid_barrier(CNT)
    tl.store(ERR + pid, errors)


@pytest.mark.parametrize("warps", [1, 4])
def test_every_program_sees_every_write_of_its_round(warps):
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seed = torch.randint(0, 1 << 20, (1,), dtype=torch.int32, device=dev)
    probe = _exchange_kernel.warmup(seed, seed, seed, seed, ROUNDS=64, SPIN=257, num_warps=warps,
                                    launch_cooperative_grid=True, grid=(1,))
    nprog = min(resident_programs(probe, sms), 8 * sms)
    assert nprog >= sms
    slot = torch.full((nprog,), -1, dtype=torch.int32, device=dev)
    err = torch.full((nprog,), -1, dtype=torch.int32, device=dev)
    cnt = barrier_counter("test exchange", dev, nprog)
    for _ in range(3):  # the counter carries over between launches
        _exchange_kernel[(nprog,)](slot, err, cnt, seed, ROUNDS=64, SPIN=257, num_warps=warps,
                                   launch_cooperative_grid=True)
        torch.cuda.synchronize()
        assert err.sum().item() == 0, f"{(err != 0).sum().item()} of {nprog} programs read stale values"
        seed.add_(1)
    assert cnt.item() % nprog == 0 and cnt.item() >= 3 * 2 * 64 * nprog


def test_a_grid_that_does_not_fit_is_refused():
    """Cooperative launches fail instead of hanging when the grid cannot be resident."""
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seed = torch.zeros(1, dtype=torch.int32, device=dev) + 3
    too_many = 64 * sms + 1
    slot = torch.zeros(too_many, dtype=torch.int32, device=dev)
    cnt = barrier_counter("test exchange", dev, too_many)
    with pytest.raises(RuntimeError):
        _exchange_kernel[(too_many,)](slot, slot, cnt, seed, ROUNDS=1, SPIN=3, num_warps=4,
                                      launch_cooperative_grid=True)
        torch.cuda.synchronize()
