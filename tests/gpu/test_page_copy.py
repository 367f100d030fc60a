"""dsv4.kernels.page_copy: the Triton page copy against the torch reference and against a page-by-page copy on the
host, on fresh random bytes: views of every word size (odd page bytes, unaligned addresses), rows strided like the
compressor state's halves, kinds with no pairs, pages larger than one program's block; the pools' copy (`PagedPools
.copy_pages`) through it; bad page lists refused before anything is written."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from dsv4.kernels.page_copy import BLOCK, PageViews, copy_pages, copy_pages_ref

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")


def _views(gen: torch.Generator) -> tuple[list[torch.Tensor], PageViews]:
    """Backing tensors of random bytes and views of three kinds over them (kind 2 is left without pairs)."""
    backing = [torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8).to(DEV) for n in (9000, 40000, 2000)]
    big = torch.randint(0, 256, (2, 7, 3 * 8 * BLOCK + 24), generator=gen, dtype=torch.uint8).to(DEV)
    backing.append(big)
    views = [
        (0, backing[0][: 12 * 640].view(12, 640)),             # 8-byte words
        (0, backing[0][8001: 8001 + 12 * 7].view(12, 7)),      # odd page bytes at an odd address: bytes
        (1, backing[1][2: 2 + 7 * 4000].view(7, 4000)),        # 2-byte words
        (1, backing[1][30000: 30000 + 7 * 1000].view(7, 1000)),  # 8-byte words
        (1, big[0]),                                           # a page of 3 blocks + 24 bytes
        (1, big[1][:, :20]),                                   # rows strided past their bytes (the state's halves)
        (2, backing[2][:1000].view(10, 100)),                  # 4-byte words, no pairs
    ]
    return backing, PageViews(views)


def _host_copy(views: PageViews, src, dst) -> list[torch.Tensor]:
    """The expected views after the copy, page by page on the host."""
    out = [v.cpu().clone() for _, v in views.views]
    for (kind, _), want in zip(views.views, out):
        old = want.clone()
        for s, d in zip(src[kind], dst[kind]):
            want[d] = old[s]
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_kernel_equals_the_reference_and_a_host_copy(seed):
    gen = torch.Generator().manual_seed(seed)
    src = [[3, 0, 11], [6, 1], []]
    dst = [[5, 9, 2], [0, 4], []]
    if seed:
        src[0], dst[0] = src[0][:1], dst[0][:1]  # kinds with fewer pairs than the widest
    backing, views = _views(gen)
    want = _host_copy(views, src, dst)
    assert {w for w in (8, 4, 2, 1) if views.table(w, torch.device(DEV)) is not None} == {8, 4, 2, 1}
    copy_pages(views, src, dst)
    got = [v.cpu() for _, v in views.views]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    # the reference from the same starting bytes
    _, again = _views(torch.Generator().manual_seed(seed))
    copy_pages_ref(again, src, dst)
    for (_, r), g in zip(again.views, got):
        assert torch.equal(r.cpu(), g)
    # bytes outside the views untouched: the backing of the strided rows past their 20 bytes
    fresh, _ = _views(torch.Generator().manual_seed(seed))
    assert torch.equal(backing[3][1][:, 20:].cpu(), fresh[3][1][:, 20:].cpu())


@pytest.mark.parametrize("src, dst, match", [
    ([[12], [], []], [[0], [], []], r"kind 0's page ids must lie in \[0, 12\)"),
    ([[1, 2], [], []], [[2, 3], [], []], "copies between the same pages"),
    ([[1], [2], []], [[3], [], []], "kind 1 has 1 source pages for 0"),
    ([[1], []], [[3], []], "2 / 2 page lists for 3 kinds"),
])
@pytest.mark.parametrize("fn", [copy_pages, copy_pages_ref])
def test_bad_page_lists_are_refused_before_any_write(src, dst, match, fn):
    backing, views = _views(torch.Generator().manual_seed(5))
    before = [b.clone() for b in backing]
    with pytest.raises(ValueError, match=match):
        fn(views, src, dst)
    assert all(torch.equal(a, b) for a, b in zip(backing, before))


def test_views_must_be_byte_pages():
    with pytest.raises(ValueError, match="uint8 \\[pages, page_bytes\\]"):
        PageViews([(0, torch.zeros(4, 8, dtype=torch.int32, device=DEV))])


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_pools_copy_through_the_kernel(kv_dtype):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_prompt_sharing import check_copy_pages
    check_copy_pages(kv_dtype, torch.bfloat16, DEV)
