"""`moe_wide.mixed_tiles_ref`: the prefill MoE's tile lists (128-row tiles over pairs of an expert's 64-row blocks, a
64-row tile for an odd last block) against a per-expert walk of `moe_align_ref`'s blocks."""

from __future__ import annotations

import pytest
import torch

from dsv4.kernels.moe_align import moe_align_ref
from dsv4.kernels.moe_wide import mixed_tiles_ref


def _walk(expert_ids: torch.Tensor) -> tuple[list[int], list[int]]:
    """(first blocks of the 128-row tiles, of the 64-row tiles), by walking each expert's run of blocks."""
    big, small, b, ids = [], [], 0, expert_ids.tolist()
    while b < len(ids) and ids[b] >= 0:
        end = b
        while end < len(ids) and ids[end] == ids[b]:
            end += 1
        big += list(range(b, end - 1, 2))[: (end - b) // 2]
        if (end - b) % 2:
            small.append(end - 1)
        b = end
    return big, small


@pytest.mark.parametrize("m,e,k,foreign", [(1, 8, 6, False), (5, 4, 2, True), (300, 16, 6, False),
                                           (700, 8, 6, True), (2048, 256, 6, False), (3000, 12, 4, True)])
def test_mixed_tiles_cover_each_used_block_once(m, e, k, foreign):
    gen = torch.Generator().manual_seed(m * 31 + e)
    scores = torch.rand(m, e, generator=gen)
    scores[:, : k + 1] += torch.rand(1, generator=gen).item()  # uneven loads: long and short segments
    ids = scores.topk(k, dim=1).indices
    if foreign:  # pairs of another rank: in no segment
        ids = torch.where(torch.rand(m, k, generator=gen) < 0.3, -1, ids)
    _, expert_ids, num_post = moe_align_ref(ids, e, 64)
    big, small = mixed_tiles_ref(expert_ids, e)
    nb = expert_ids.numel()
    assert big.dtype == small.dtype == torch.int32 and big.numel() == nb // 2 and small.numel() == min(e, nb)
    want_big, want_small = _walk(expert_ids)
    assert big.tolist() == want_big + [-1] * (big.numel() - len(want_big))
    assert small.tolist() == want_small + [-1] * (small.numel() - len(want_small))
    covered = sorted([b for b in want_big] + [b + 1 for b in want_big] + want_small)
    assert covered == list(range(int(num_post) // 64))  # every used block in exactly one tile
    assert all(expert_ids[b] == expert_ids[b + 1] for b in want_big)  # a 128-row tile has one expert
