"""moe_gemv(gate_up=True) (the decode GLU's gate rows and up rows in programs of their own, handing their
partials off as a K split does) against the one-program GLU. Small enough for Triton's interpreter (in the
Makefile's KERNEL_TESTS); the H200 runs it with tests/gpu."""
from __future__ import annotations

import os

import pytest
import torch
from test_moe_gemv_mma import LIMIT, _experts, _launch, _routing

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


@pytest.mark.parametrize("shape,split", [("bn64", 1), ("bn64", 2), ("bn64_u1_s4", 4), ("bn128_w8", 1),
                                         ("bn64_u4_kd2", 2)])
def test_gate_up_programs_same_bits(shape, split, poison, monkeypatch):
    """Each half's accumulator sees the same fp32 terms in the same order, and the last of a tile's 2 S arrivals
    sums each half's S partials in split order from 0.0 as a K split does: the same z, so the same outputs for
    every pair of this rank (other ranks' pairs skipped), with and without a K split, z quantised in the epilogue
    (bn 128) or after it. Twice in a row: the arrival counters are back at 0 after each launch."""
    from dsv4.kernels import moe_gemv as mg
    from dsv4.kernels.moe import finalize_experts

    e, d, i, k, m = 8, 512, 256, 6, 3
    gen = torch.Generator(DEV).manual_seed(len(shape) * 5 + split)
    packed = finalize_experts(_experts(e, d, i, gen))
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    mine = (ids.reshape(-1) >= 0).nonzero()[:, 0]
    run = dict(_launch(shape), method="mma", split=split, split_down=1)
    poison()
    want = mg.moe_gemv(x, ids, w, packed, LIMIT, **run)[mine]
    assert torch.isfinite(want.float()).all() and want.float().std() > 0
    launches, real = [], mg._mma_glu_kernel

    class Recorded:  # the GLU's grids
        def __getitem__(self, grid):
            launches.append(grid)
            return real[grid]

    monkeypatch.setattr(mg, "_mma_glu_kernel", Recorded())
    for _ in range(2):
        poison()
        got = mg.moe_gemv(x, ids, w, packed, LIMIT, gate_up=True, **run)[mine]
        assert torch.equal(got, want), f"{shape} split {split}: {int((got != want).sum())} outputs differ"
    ranges = min(split, d // 128 // mg._unroll(d, run["unroll"]))  # (a split is capped at the loop steps)
    assert [g[2] for g in launches] == [2 * ranges] * 2, launches  # gate and up programs per K range
