"""Which K split the persistent decode GEMV kernel (dsv4.kernels.moe_glu_decode) takes for an expert shape: a
re-derivation of the rule from its constraints (whole 2-block steps for every consumer in every K range, at most
ODD_SPLIT_MAX ranges), over the released shapes and random ones; and its row tiles per run. CPU only: the choice is
host logic."""

from __future__ import annotations

import random
import types

import pytest

from dsv4.kernels import moe_glu_decode as g


def _ok(k: int, s: int) -> bool:
    blocks = k // 128 // s  # per range: a power of two (the kernel's shared-memory tile shape)
    return k % (128 * g.U * s * g.CONSUMERS) == 0 and blocks in {2 ** i for i in range(12)}


def _expected(k: int, n: int, preferred: int, odd: bool, most: bool) -> int | None:
    """`preferred` if it fits, else with `odd` the most (the GLU) or the fewest (the down, from `preferred` up)
    of the splits up to ODD_SPLIT_MAX that fit."""
    if n % 128:
        return None
    if _ok(k, preferred):
        return preferred
    if odd:
        fitting = [s for s in range(1 if most else preferred, g.ODD_SPLIT_MAX + 1) if _ok(k, s)]
        return (max(fitting) if most else min(fitting)) if fitting else None
    return None


@pytest.mark.parametrize("odd,down_odd", [(False, False), (True, False), (False, True), (True, True)])
def test_split_choice(odd, down_odd, monkeypatch):
    monkeypatch.setattr(g, "ODD_SPLIT", odd)
    monkeypatch.setattr(g, "DOWN_ODD_SPLIT", down_odd)
    rng = random.Random(1234 + odd + 2 * down_odd)
    shapes = [(4096, 2048), (7168, 3072)] + [(128 * rng.randint(1, 80), 128 * rng.randint(1, 40)) for _ in range(200)]
    for hidden, inter in shapes:
        experts = types.SimpleNamespace(hidden=hidden, inter=inter)
        assert g._split(experts, True) == _expected(hidden, inter, g.SPLIT, odd, True), (hidden, inter)
        assert g._split(experts, False) == _expected(inter, hidden, g.DOWN_SPLIT, down_odd, False), (hidden, inter)


def test_released_shapes(monkeypatch):
    flash, pro = types.SimpleNamespace(hidden=4096, inter=2048), types.SimpleNamespace(hidden=7168, inter=3072)
    monkeypatch.setattr(g, "ODD_SPLIT", False)
    assert g._split(flash, True) == g.SPLIT and g._split(pro, True) is None
    monkeypatch.setattr(g, "ODD_SPLIT", True)
    monkeypatch.setattr(g, "DOWN_ODD_SPLIT", False)
    assert g._split(pro, True) == 7 and g._split(pro, False) is None  # (3072 = 24 blocks in one range)
    assert g._split(flash, False) == g.DOWN_SPLIT
    monkeypatch.setattr(g, "DOWN_ODD_SPLIT", True)
    assert g._split(pro, False) == 3 and g._split(flash, False) == g.DOWN_SPLIT  # (3 ranges of 8 blocks)


@pytest.mark.parametrize("consumers,stages,ok", [(2, 3, False), (2, 5, False), (2, 0, False), (2, 4, True),
                                                 (1, 3, True)])
def test_ring_slots_a_multiple_of_the_consumers(consumers, stages, ok, monkeypatch):
    """Two consumer warpgroups take alternate steps, so a ring whose slot count is odd hands a slot to each in turn,
    and one could pass a phase the other has not consumed (3 GLU slots and 5 down slots faulted on the GPU,
    session 78): such a ring is refused before anything is launched."""
    monkeypatch.setattr(g, "CONSUMERS", consumers)
    experts = types.SimpleNamespace(hidden=4096, inter=2048, num_experts=8)
    if ok:  # past the check: the next one (a split that does not tile K) still speaks
        with pytest.raises(ValueError, match="must split"):
            g._launch(None, None, None, experts, True, 6, 3, stages)
    else:
        with pytest.raises(ValueError, match="ring slots"):
            g._launch(None, None, None, experts, True, 6, g.SPLIT, stages)


@pytest.mark.parametrize("long_from", [0, 48, 5])
def test_unit_run_rule(long_from, monkeypatch):
    """The GLU's row tiles per run: the long run from `long_from` pairs (0: never) only where it divides a matrix's
    tiles (the GPU suite's inter-128 shapes have 2), else the short run; a short run that does not divide is refused."""
    monkeypatch.setattr(g, "LONG_UNIT_RUN_FROM_PAIRS", long_from)
    rng = random.Random(99 + long_from)
    for _ in range(300):
        short, long_ = rng.choice([1, 2, 4]), rng.choice([4, 8])
        monkeypatch.setattr(g, "UNIT_RUN", short)
        monkeypatch.setattr(g, "LONG_UNIT_RUN", long_)
        pairs, tiles = rng.randint(1, 96), rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 32, 48, 64])
        want = long_ if 0 < long_from <= pairs and tiles % long_ == 0 else short
        if tiles % want:
            with pytest.raises(ValueError, match="do not divide"):
                g._unit_run(pairs, tiles)
        else:
            assert g._unit_run(pairs, tiles) == want, (pairs, tiles, short, long_)
