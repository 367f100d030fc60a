"""The routed MoE's combine (`moe_combine.combine`) with its rows given as fp32 partials [R, pairs, D] (the persistent
down GEMV's output, `moe_glu_decode.down_decode`): each row the bf16 rounding of its partials summed in order, then
combined exactly as if those bf16 rows had been stored first -- the same bits, other ranks' pairs skipped."""

from __future__ import annotations

import os

import pytest
import torch

from tests.gpu.test_moe_gemv_mma import _gpu_like_casts  # noqa: F401  (autouse: the interpreter rounds like the GPU)

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def _reference(part, ids, shared, dtype, e):
    """out[t] = dtype(sum over slots j in order, from 0.0, of bf16(sum_r part[r, t k + j]) (+ shared[t]))."""
    m, k = ids.shape
    rows = torch.zeros(part.shape[1:], dtype=torch.float32, device=part.device)
    for r in range(part.shape[0]):
        rows = rows + part[r]
    rows = rows.to(torch.bfloat16).float()
    out = torch.zeros((m, part.shape[2]), dtype=torch.float32, device=part.device)
    for j in range(k):
        here = ((ids[:, j] >= 0) & (ids[:, j] < e))[:, None]
        out = out + torch.where(here, rows[j::k], 0.0)
    if shared is not None:
        out = out + shared.float()
    return out.to(dtype)


@pytest.mark.parametrize("ranges,dtype,with_shared", [(1, torch.bfloat16, False), (4, torch.bfloat16, True),
                                                       (8, torch.float32, True)])
def test_combine_of_partials(ranges, dtype, with_shared):
    from dsv4.kernels.moe_combine import combine

    m, k, d, e = 3, 6, 1600, 16  # (d not a multiple of the combine's column blocks: the mask)
    gen = torch.Generator(DEV).manual_seed(ranges * 3 + with_shared)
    part = torch.randn(ranges, m * k, d, generator=gen, device=DEV) * 3
    ids = torch.randint(0, e, (m, k), generator=gen, device=DEV)
    ids[0, 1] = -1  # another rank's pair: its partials are garbage, never read
    part[:, 1] = float("nan")
    shared = (torch.randn(m, d, generator=gen, device=DEV)).to(torch.bfloat16) if with_shared else None
    out = combine(part, shared, ids, torch.empty((m, d), dtype=dtype, device=DEV), e)
    want = _reference(torch.nan_to_num(part), ids, shared, dtype, e)
    assert torch.equal(out, want), f"max |diff| {float((out.float() - want.float()).abs().max())}"
    # the same bits as the bf16 rows stored first and combined
    rows = torch.zeros_like(part[0])
    for r in range(ranges):
        rows = rows + part[r]
    stored = combine(rows.to(torch.bfloat16), shared, ids, torch.empty((m, d), dtype=dtype, device=DEV), e)
    assert torch.equal(out, stored)
