"""Token -> expert alignment (`moe_align`: "scan", "sort" and "blocks") and the prefill MoE's mixed tile lists
(`moe_wide.mixed_tiles`' kernel) vs their torch references, bit for bit; interpreter-run in `make test`."""

from __future__ import annotations

import os

import pytest
import torch

# "cpu" under TRITON_INTERPRET=1 (the kernel tests of `make test`)
DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def _topk(m: int, e: int, k: int, gen: torch.Generator, skew: bool = False):
    scores = torch.rand(m, e, generator=gen, device=DEV)
    if skew:  # most tokens pick the same few experts: long segments next to empty ones
        scores[:, : k + 1] += 1.0
    ids = scores.topk(k, dim=1).indices
    w = torch.rand(m, k, generator=gen, device=DEV) * 1.5 + 0.1
    return ids, w


@pytest.mark.parametrize("m,e,k,bm", [(1, 8, 6, 16), (7, 8, 3, 16), (64, 256, 6, 16), (1000, 256, 6, 64),
                                      (300, 384, 6, 64), (4096, 256, 6, 64)])
@pytest.mark.parametrize("skew", [False, True])
@pytest.mark.parametrize("method", ["scan", "sort", "blocks"])
def test_moe_align_matches_reference(m, e, k, bm, skew, method, poison):
    from dsv4.kernels.moe_align import moe_align, moe_align_ref

    gen = torch.Generator(DEV).manual_seed(m * 3 + e + bm)
    ids, _ = _topk(m, e, k, gen, skew)
    ids = ids.to(torch.int32)
    poison()
    s, eids, n = moe_align(ids, e, bm, method=method)
    sr, eidr, nr = moe_align_ref(ids, e, bm)
    assert torch.equal(n, nr)
    assert torch.equal(eids, eidr)
    assert s.shape == sr.shape
    assert torch.equal(s, sr)  # ascending pair order inside each expert, sentinel in padding
    assert bool((s[int(nr):] == m * k).all())


@pytest.mark.parametrize("pairs_per_block", [16, 64])
def test_moe_align_blocks_carry_over_many_blocks(pairs_per_block, monkeypatch, poison):
    """"blocks" with more blocks than its prefix kernel takes per step (64): the running per-expert prefix carries
    from one step of blocks to the next; every block writes its share of the block -> expert table."""
    import importlib
    ma = importlib.import_module("dsv4.kernels.moe_align")  # (the package exports the function by that name)
    monkeypatch.setattr(ma, "BLOCK_PAIRS", pairs_per_block)
    gen = torch.Generator(DEV).manual_seed(pairs_per_block)
    ids, _ = _topk(1100, 64, 6, gen, skew=True)  # 6600 pairs: 413 / 104 blocks
    ids = ids.to(torch.int32)
    poison()
    s, eids, n = ma.moe_align(ids, 64, 32, method="blocks")
    sr, eidr, nr = ma.moe_align_ref(ids, 64, 32)
    assert torch.equal(n, nr) and torch.equal(eids, eidr) and torch.equal(s, sr)


@pytest.mark.parametrize("m,e,k,bm", [(1, 8, 6, 16), (64, 128, 6, 16), (1000, 128, 6, 64)])
@pytest.mark.parametrize("method", ["scan", "sort", "blocks"])
def test_moe_align_skips_other_ranks_pairs(m, e, k, bm, method, poison):
    """Expert parallel: ids outside [0, E) (-1, or an expert of another rank) are left out."""
    from dsv4.kernels.moe_align import moe_align, moe_align_ref

    gen = torch.Generator(DEV).manual_seed(m + e + 7)
    ids, _ = _topk(m, 2 * e, k, gen)  # half the ids belong to "the other rank"
    ids = torch.where(ids < e, ids, torch.where(ids % 2 == 0, -1, ids)).to(torch.int32)
    poison()
    s, eids, n = moe_align(ids, e, bm, method=method)
    sr, eidr, nr = moe_align_ref(ids, e, bm)
    assert torch.equal(n, nr) and torch.equal(eids, eidr) and torch.equal(s, sr)
    kept = s[s < m * k].long()
    assert kept.numel() == int(((ids >= 0) & (ids < e)).sum())  # every local pair once, no other
    assert bool((ids.reshape(-1)[kept] < e).all()) and bool((ids.reshape(-1)[kept] >= 0).all())


@pytest.mark.parametrize("m,e,k,foreign", [(1, 8, 6, False), (300, 16, 6, True), (2048, 256, 6, False),
                                           (3000, 12, 4, True)])
def test_mixed_tiles_kernel_matches_reference(m, e, k, foreign, monkeypatch, poison):
    """`mixed_tiles` in one launch (moe_wide.MIXED_TILES_KERNEL) gives `mixed_tiles_ref`'s lists exactly."""
    from dsv4.kernels import moe_wide
    from dsv4.kernels.moe_align import moe_align_ref

    gen = torch.Generator(DEV).manual_seed(m + e)
    ids, _ = _topk(m, e, k, gen, skew=True)
    if foreign:  # pairs of another rank: in no segment
        ids = torch.where(torch.rand(m, k, generator=gen, device=DEV) < 0.3, -1, ids)
    _, expert_ids, _ = moe_align_ref(ids, e, 64)
    want = moe_wide.mixed_tiles_ref(expert_ids, e)
    monkeypatch.setattr(moe_wide, "MIXED_TILES_KERNEL", True)
    poison()
    got = moe_wide.mixed_tiles(expert_ids, e)
    assert all(torch.equal(g, w) for g, w in zip(got, want)), (got, want)
    assert int((want[0] >= 0).sum()) > 0 or m == 1
