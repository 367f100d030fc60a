"""Page bookkeeping for the hybrid DeepSeek-V4 cache (pure Python; the tensors live elsewhere).

Every kind of per-sequence state is stored in fixed-size pages from its own preallocated pool;
a pool tensor is indexed by page id, and every layer of a kind shares the sequence's block table
for that kind (spec deepseek_v4_model.md §3.1). Kinds and what a sequence of n tokens needs:

  window         ring of `window` token slots (position p -> slot p mod window): ceil(min(n, window) / page)
                 pages; once full the same pages are reused as the window slides
  compressed{r}  one entry per r tokens, append-only: ceil(floor(n / r) / page) pages   (CSA r=4, HCA r=128)
  indexer4       CSA indexer keys, one per 4 tokens: as compressed4
  state          compressor partial-window state, fixed size: one page (a pool slot) per sequence

Pages are reference-counted: a fork of a prefix (dsv4.engine.prompt_sharing, prefix_snapshots) *shares* the
source's full pages of append-only entries that no holder can write again (`PageKind.final_pages`) and copies the
rest; a shared page returns to its pool when its last holder frees it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping

WINDOW = "window"
STATE = "state"
INDEXER_RATIO = 4  # only CSA (ratio-4) layers have the lightning indexer


class PageHolder:
    """Pages held by something that is not a running sequence (a retained sequence, a prefix snapshot): what
    `BlockManager.allocate` / `free` and the paged layer states read."""

    def __init__(self, request_id: str, block_tables: dict[str, list[int]] | None = None,
                 num_computed_tokens: int = 0):
        self.request_id, self.num_computed_tokens = request_id, num_computed_tokens
        self.block_tables = block_tables if block_tables is not None else {}


class OutOfPages(RuntimeError):
    """An allocation was attempted without checking can_allocate first."""


def pages_needed(num_tokens: int, ratio: int, page_size: int, ring: int = 0) -> int:
    """Pages one kind needs for a sequence whose first `num_tokens` tokens are computed.

    ratio 0: fixed per-sequence state (one page); ring > 0: a ring of `ring` token slots;
    otherwise one entry per `ratio` tokens."""
    if num_tokens <= 0:
        return 0
    if ratio == 0:
        return 1
    entries = min(num_tokens, ring) if ring else num_tokens // ratio
    return -(-entries // page_size)


@dataclass(frozen=True)
class PageKind:
    name: str
    page_size: int   # token slots (window) or entries per page; 1 for state
    num_pages: int   # pool capacity
    ratio: int       # tokens per entry: 1 for the window, r for compressed/indexer kinds, 0 for state
    ring: int = 0    # window length in tokens for the window kind, else 0

    def __post_init__(self) -> None:
        for f in ("page_size", "num_pages"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"page kind {self.name!r}: {f}={v!r}; expected an integer >= 1")
        if self.ratio < 0 or self.ring < 0 or (self.ring and self.ratio != 1):
            raise ValueError(f"page kind {self.name!r}: ratio={self.ratio}, ring={self.ring} are inconsistent")

    def pages_needed(self, num_tokens: int) -> int:
        return pages_needed(num_tokens, self.ratio, self.page_size, self.ring)

    def final_pages(self, num_final_tokens: int) -> int:
        """Full pages of entries that the first `num_final_tokens` tokens complete: pages a fork may share, where no
        holder can roll back below that many tokens (entry e is written once, when token r*e + r - 1 is computed).
        0 for the window ring and the state, which are rewritten as a sequence goes on."""
        if self.ratio == 0 or self.ring or num_final_tokens <= 0:
            return 0
        return num_final_tokens // self.ratio // self.page_size

    def locate(self, block_table: list[int], index: int) -> tuple[int, int]:
        """(page id, offset in page) of a token position (window kind) or an entry index (others)."""
        if self.ratio == 0:
            return block_table[0], 0
        if self.ring:
            index %= self.ring
        return block_table[index // self.page_size], index % self.page_size


def required_kinds(compress_ratios: Iterable[int]) -> tuple[str, ...]:
    """Names of the page kinds a layer schedule needs (compress_ratios: one entry per layer, incl. MTP)."""
    ratios = sorted({int(r) for r in compress_ratios} - {0})
    names = [WINDOW]
    for r in ratios:
        names.append(f"compressed{r}")
        if r == INDEXER_RATIO:
            names.append(f"indexer{r}")
    if ratios:
        names.append(STATE)
    return tuple(names)


def make_page_kinds(compress_ratios: Iterable[int], window: int, page_sizes: Mapping[str, int],
                    num_pages: Mapping[str, int]) -> list[PageKind]:
    """PageKinds for a layer schedule. `page_sizes` / `num_pages` are keyed by kind name
    (page_sizes may omit "state", whose page is one sequence's state)."""
    kinds = []
    for name in required_kinds(compress_ratios):
        if name not in num_pages:
            raise ValueError(f"num_pages: missing an entry for page kind {name!r}")
        if name == STATE:
            kinds.append(PageKind(name, 1, num_pages[name], ratio=0))
            continue
        if name not in page_sizes:
            raise ValueError(f"page_sizes: missing an entry for page kind {name!r}")
        if name == WINDOW:
            kinds.append(PageKind(name, page_sizes[name], num_pages[name], ratio=1, ring=window))
        else:
            ratio = int(name.removeprefix("compressed").removeprefix("indexer"))
            kinds.append(PageKind(name, page_sizes[name], num_pages[name], ratio=ratio))
    return kinds


class PagePool:
    """Free list of one kind's page ids (lowest ids first; freed pages go to the back) and the number of holders of
    each page in use."""

    def __init__(self, kind: PageKind) -> None:
        self.kind = kind
        self.free_ids: deque[int] = deque(range(kind.num_pages))
        self.refs: dict[int, int] = {}  # page in use -> its holders
        self.num_shared = 0             # pages in use by more than one holder (kept as refs change: read every step)

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_ids):
            raise OutOfPages(f"page kind {self.kind.name!r}: asked for {n} pages, {len(self.free_ids)} free")
        ids = [self.free_ids.popleft() for _ in range(n)]
        for i in ids:
            self.refs[i] = 1
        return ids

    def share(self, ids: Iterable[int]) -> None:
        """One more holder for each of `ids` (pages in use: `BlockManager.share` checks)."""
        for i in ids:
            self.refs[i] += 1
            self.num_shared += self.refs[i] == 2

    def free(self, ids: Iterable[int]) -> None:
        """One holder fewer for each of `ids`; a page nobody holds goes back to the free list."""
        for i in ids:
            n = self.refs.get(i)
            if n is None:
                raise ValueError(f"page kind {self.kind.name!r}: page {i} freed twice or never allocated")
            if n > 1:
                self.refs[i] = n - 1
                self.num_shared -= n == 2
            else:
                del self.refs[i]
                self.free_ids.append(i)


class BlockManager:
    """One allocator over several page kinds; a sequence holds `seq.block_tables[kind]`."""

    def __init__(self, kinds: Iterable[PageKind]) -> None:
        self.kinds = {k.name: k for k in kinds}
        if not self.kinds:
            raise ValueError("BlockManager: no page kinds")
        self.pools = {name: PagePool(k) for name, k in self.kinds.items()}

    def _missing(self, seq, num_new_tokens: int) -> dict[str, int]:
        target = seq.num_computed_tokens + num_new_tokens
        return {name: max(k.pages_needed(target) - len(seq.block_tables.get(name, ())), 0)
                for name, k in self.kinds.items()}

    def can_allocate(self, seq, num_new_tokens: int) -> bool:
        """Whether pages for tokens [num_computed_tokens, num_computed_tokens + num_new_tokens) fit."""
        return self.can_allocate_all([(seq, num_new_tokens)])

    def can_allocate_all(self, requests: Iterable[tuple]) -> bool:
        """Whether the pages of every (seq, num_new_tokens) in `requests` fit together."""
        need: dict[str, int] = {}
        for seq, n in requests:
            for name, k in self._missing(seq, n).items():
                need[name] = need.get(name, 0) + k
        return all(k <= self.pools[name].num_free for name, k in need.items())

    def allocate(self, seq, num_new_tokens: int) -> None:
        """Grow every block table to cover num_computed_tokens + num_new_tokens tokens (all kinds or none)."""
        missing = self._missing(seq, num_new_tokens)
        if not all(n <= self.pools[name].num_free for name, n in missing.items()):
            raise OutOfPages(f"request {seq.request_id!r}: not enough free pages for {num_new_tokens} tokens")
        for name, n in missing.items():
            if n:
                seq.block_tables.setdefault(name, []).extend(self.pools[name].allocate(n))

    def share(self, seq, block_tables: Mapping[str, list[int]], num_final_tokens: int) -> dict[str, int]:
        """Start the empty block tables of `seq` with the pages of `block_tables` (another holder's) whose entries
        its first `num_final_tokens` tokens complete, shared (`PageKind.final_pages`); returns the pages shared per
        kind. The caller copies the rest (`PagedPools.copy_pages`)."""
        counts = {name: kind.final_pages(num_final_tokens) for name, kind in self.kinds.items()}
        plan = {name: list(block_tables[name][:n]) for name, n in counts.items() if n and block_tables.get(name)}
        for name, ids in plan.items():  # checked first: all kinds shared or none
            if seq.block_tables.get(name):
                raise ValueError(f"request {seq.request_id!r}: pages are shared only into an empty block table")
            if any(i not in self.pools[name].refs for i in ids):
                raise ValueError(f"page kind {name!r}: pages {ids} are not all in use and cannot be shared")
        for name, ids in plan.items():
            self.pools[name].share(ids)
            seq.block_tables[name] = ids
        return {name: len(ids) for name, ids in plan.items()}

    def free(self, seq) -> None:
        for name, table in seq.block_tables.items():
            self.pools[name].free(table)
        seq.block_tables = {}

    def fits_alone(self, num_tokens: int) -> bool:
        """Whether a single sequence of num_tokens tokens fits in the empty pools."""
        return all(k.pages_needed(num_tokens) <= k.num_pages for k in self.kinds.values())

    def num_free(self, kind: str) -> int:
        return self.pools[kind].num_free

    def num_total(self, kind: str) -> int:
        return self.kinds[kind].num_pages

    def num_shared(self) -> int:
        """Pages held by more than one holder now, summed over kinds."""
        return sum(p.num_shared for p in self.pools.values())

    def usage(self) -> dict[str, float]:
        """Fraction of pages in use, per kind."""
        return {name: 1.0 - p.num_free / p.kind.num_pages for name, p in self.pools.items()}
