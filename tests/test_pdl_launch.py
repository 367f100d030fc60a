"""`dsv4.kernels._triton.pdl_kernel` (programmatic dependent launch) without a GPU: the decorator refuses a
kernel whose body never waits for the previous kernel, and launches with `launch_pdl=True` exactly when PDL
is on (tests/gpu/test_pdl.py checks the bits on the H200)."""
from __future__ import annotations

import random

import pytest

from dsv4.kernels import _triton


class _FakeJit:
    """What `pdl_kernel` uses of a JITFunction: `.fn` (the Python source) and `kernel[grid](*args, **kw)`."""

    def __init__(self, fn):
        self.fn, self.__name__, self.calls = fn, fn.__name__, []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))


def _waits(x, y):
    pdl_wait()  # noqa: F821 - only parsed, never run
    return x + y


def _never_waits(x, y):
    return x + y


def test_kernel_without_pdl_wait_is_refused():
    with pytest.raises(TypeError, match="_never_waits.*pdl_wait"):
        _triton.pdl_kernel(_FakeJit(_never_waits))


@pytest.mark.parametrize("on", [True, False])
def test_launch_carries_launch_pdl_only_when_on(monkeypatch, on):
    monkeypatch.setattr(_triton, "PDL", on)
    jit = _FakeJit(_waits)
    kernel = _triton.pdl_kernel(jit)
    grid = (random.randint(1, 500), random.randint(1, 4))
    args = [random.random() for _ in range(3)]
    kernel[grid](*args, BLOCK=64, num_warps=4)
    want = dict(BLOCK=64, num_warps=4, **({"launch_pdl": True} if on else {}))
    assert jit.calls == [(grid, tuple(args), want)]
    assert kernel.__name__ == "_waits"  # other attributes pass through to the JITFunction


def test_pdl_is_off_without_triton_or_under_the_interpreter():
    if not _triton.HAS_TRITON or _triton.INTERPRET:
        assert _triton.PDL is False
    else:
        import os
        assert _triton.PDL == (os.environ.get("DSV4_PDL", "1") != "0")
