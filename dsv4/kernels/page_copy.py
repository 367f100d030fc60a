"""One cache copy (a fork, a prefix snapshot, a retained prompt-end copy) in one or two Triton launches.

`copy_pages(views, src, dst)`: for every kind k and pair i, page `src[k][i]` of each of kind k's views is copied
onto page `dst[k][i]`. A view is a pool tensor seen as bytes, `[pages, page_bytes]` uint8 whose rows may be
strided (the compressor state's two halves). Source and destination pages must be distinct: the copies are not
ordered. `copy_pages_ref` is the same in torch (index_select + index_copy_ per view).

Why a kernel: Flash's pools are 359 tensors, so the torch copy is 718 launches; measured on the H200
(`bench/bench_copy_pages.py`, session 58) one fork's copy took 8.8 ms of GPU and 9.0 ms of host time where a
copy of the same 28 MiB takes 18 µs. The kernel reads the views' addresses from a table made once, and copies
every page of every view in one launch per word size (the widest of 8 / 4 / 2 / 1 bytes that divides a view's
address, page stride and page bytes; Flash's views are all 8).
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, tl, triton
from dsv4.model.context import to_device

BLOCK = 1024  # words per program and step
MAX_SPLIT = 16  # programs per (view, page pair) for the large pages
WORDS = (8, 4, 2, 1)  # bytes per word, widest first


class PageViews:
    """The byte views of a cache's pools, each tagged with its kind (an index into the copy's lists)."""

    def __init__(self, views: list[tuple[int, torch.Tensor]]):
        for kind, v in views:
            if v.dim() != 2 or v.dtype != torch.uint8 or v.stride(1) != 1:
                raise ValueError(f"PageViews: a view must be uint8 [pages, page_bytes] with contiguous rows, got "
                                 f"{v.dtype} {tuple(v.shape)} strides {v.stride()}")
        self.views = views
        self.num_kinds = 1 + max((k for k, _ in views), default=-1)
        self.pages = [min((v.shape[0] for k, v in views if k == kind), default=0) for kind in range(self.num_kinds)]
        self._tables: dict[int, tuple] = {}  # word bytes -> (device table [T, 4] int64, views' max words)

    def pairs(self, src: list[list[int]], dst: list[list[int]]) -> list[list[tuple[int, int]]]:
        """The (source, destination) page pairs per kind, checked."""
        if len(src) != self.num_kinds or len(dst) != self.num_kinds:
            raise ValueError(f"copy_pages: {len(src)} / {len(dst)} page lists for {self.num_kinds} kinds")
        out = []
        for kind, (s, d) in enumerate(zip(src, dst)):
            if len(s) != len(d):
                raise ValueError(f"copy_pages: kind {kind} has {len(s)} source pages for {len(d)}")
            ids = list(s) + list(d)
            if ids and not (0 <= min(ids) and max(ids) < self.pages[kind]):
                raise ValueError(f"copy_pages: kind {kind}'s page ids must lie in [0, {self.pages[kind]}), got {ids}")
            if set(s) & set(d):
                raise ValueError(f"copy_pages: kind {kind} copies between the same pages {sorted(set(s) & set(d))}")
            out.append(list(zip(s, d)))
        return out

    def table(self, word: int, device) -> tuple[torch.Tensor, int] | None:
        """[T, 4] int64 (address, page stride in words, page words, kind) of the views copied in `word`-byte
        words, on `device`, made once (the pools never move); None when no view takes that word size."""
        if word not in self._tables:
            rows = [(v.data_ptr(), v.stride(0) // word, v.shape[1] // word, kind)
                    for kind, v in self.views if _word_bytes(v) == word]
            self._tables[word] = (torch.tensor(rows, dtype=torch.int64, device=device),
                                  max(r[2] for r in rows)) if rows else None
        return self._tables[word]


def _word_bytes(v: torch.Tensor) -> int:
    """The widest word that divides the view's address, page stride and page bytes."""
    return next(w for w in WORDS if (v.data_ptr() | v.stride(0) | v.shape[1]) % w == 0)


# --------------------------------------------------------------------------- torch reference

def copy_pages_ref(views: PageViews, src: list[list[int]], dst: list[list[int]]) -> None:
    """Torch `copy_pages`."""
    pairs = views.pairs(src, dst)
    if not any(pairs):
        return
    device = views.views[0][1].device  # (the pools of one cache share it; pinned: no wait for the GPU's queue)
    index = [None if not p else (to_device(torch.tensor([a for a, _ in p]), device),
                                 to_device(torch.tensor([b for _, b in p]), device)) for p in pairs]
    for kind, v in views.views:
        if index[kind] is not None:
            v.index_copy_(0, index[kind][1], v.index_select(0, index[kind][0]))


# --------------------------------------------------------------------------- Triton kernel

if HAS_TRITON:
    @triton.jit
    def _copy_pages_kernel(TABLE, PAIRS, NUM_PAIRS, WORD: tl.constexpr, BLOCK: tl.constexpr):
        view, pair, part = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        kind = tl.load(TABLE + view * 4 + 3)
        src = tl.load(PAIRS + (kind * NUM_PAIRS + pair) * 2)
        dst = tl.load(PAIRS + (kind * NUM_PAIRS + pair) * 2 + 1)
        if src >= 0:  # (-1: this kind has fewer pairs than the widest)
            if WORD == 8:
                ty = tl.int64
            elif WORD == 4:
                ty = tl.int32
            elif WORD == 2:
                ty = tl.int16
            else:
                ty = tl.int8
            base = tl.load(TABLE + view * 4).to(tl.pointer_type(ty))
            stride = tl.load(TABLE + view * 4 + 1)
            words = tl.load(TABLE + view * 4 + 2)
            a, b = base + src * stride, base + dst * stride
            for start in range(part * BLOCK, words, tl.num_programs(2) * BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < words
                tl.store(b + offs, tl.load(a + offs, mask=mask), mask=mask)


def copy_pages(views: PageViews, src: list[list[int]], dst: list[list[int]]) -> None:
    """Triton `copy_pages`: one launch per word size the views take."""
    pairs = views.pairs(src, dst)
    width = max(map(len, pairs), default=0)
    if width == 0:
        return
    device = views.views[0][1].device
    padded = [[list(pair) for pair in p] + [[-1, -1]] * (width - len(p)) for p in pairs]
    flat = to_device(torch.tensor(padded, dtype=torch.int64), device)  # [kinds, width, 2]
    for word in WORDS:
        hit = views.table(word, device)
        if hit is None:
            continue
        table, most = hit
        split = min(MAX_SPLIT, triton.cdiv(most, BLOCK))
        _copy_pages_kernel[(table.shape[0], width, split)](table, flat, width, WORD=word, BLOCK=BLOCK)
