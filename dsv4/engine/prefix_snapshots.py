"""Snapshots of a prompt prefix that several requests share (a system prompt, few-shot examples, a document).

The hybrid cache cannot be cut back to an arbitrary earlier position (the window ring and the compressors' raw rows
keep only `max_rollback` tokens of history), so a prefix can be reused only where a state *at its end* was kept.
With `EngineConfig.prefix_snapshots = N` the engine learns where: every admitted prompt's blocks of SNAPSHOT_BLOCK
tokens are hashed as a chain (a block's hash stands for the whole prefix up to it). A fresh request whose prompt
starts with a block-aligned prefix that an earlier request's prompt had stops a prefill chunk at that prefix's end;
when that chunk is done its state and pages are copied into a snapshot. A later request whose prompt extends a
snapshot copies it (`PromptSharing.fork`, the snapshot as its source) and computes only the rest of its prompt.
"Copied": the full pages of compressed entries and indexer keys, which nobody writes again, are shared (counted
holders, `BlockManager.share`), so a long prefix costs its pages once however many requests fork it; the window
ring, the compressors' state and the last, partly filled entry pages are copied.

So the first request with a prefix computes it, the second computes it too and keeps it, the next ones reuse it;
those that arrive while the second is still computing it wait for its snapshot (`PromptSharing.source_computing`)
rather than compute it too -- a batch of prompts with one system prompt computes it twice.
The hashes only say where to snapshot; what a request adopts is checked token by token. Up to N snapshots are kept,
the least recently used evicted first; their pages give way (after retained sequences') before anybody is preempted.
Not for requests asking for prompt logprobs (scored from their first token).
"""
from __future__ import annotations

import itertools
from collections import OrderedDict

from .block_manager import PageHolder
from .sequence import Sequence

SNAPSHOT_BLOCK = 64   # snapshot points are multiples of it (at most SNAPSHOT_BLOCK - 1 shared tokens computed again)
MAX_HASHES = 1 << 16  # block hashes remembered (least recently seen forgotten first)


def final_tokens(state, mtp: bool) -> int:
    """Tokens that neither `state` nor a fork of it can roll back below (the least `min_length` of its layers, the
    MTP layer's where speculative decoding runs it): the entries they complete are never written again, so their
    full pages can be shared."""
    return min(layer.min_length for layer in [*state.layers, *([state.mtp] if mtp else [])])


def copy_rest(pools, src: dict[str, list[int]], dst: dict[str, list[int]], shared: dict[str, int]) -> None:
    """Copy the pages of `dst` after its first `shared[kind]` ones (shared, not copied) from `src`'s."""
    pools.copy_pages({k: v[shared.get(k, 0):] for k, v in src.items()},
                     {k: v[shared.get(k, 0):] for k, v in dst.items()})


def fork_state(state, owner):
    """A copy of decode state `state` (counters) whose paged layer states read `owner`'s block tables."""
    return type(state)([layer.fork(owner) for layer in state.layers],
                       state.mtp.fork(owner) if state.mtp is not None else None)


def copy_into(cache, name: str, seq: Sequence, state, mtp: bool, make_room) -> tuple[PageHolder, object] | None:
    """A copy of running `seq`'s cache as it stands after this step's forward (`state`, `state.num_tokens` tokens:
    the scheduler may not have counted them yet), held by a new PageHolder `name`: the final entry pages shared, the
    rest copied. `make_room()` frees something of the caller's while the copy does not fit (False: nothing left);
    None where it still does not."""
    at = state.num_tokens
    holder = PageHolder(name)
    bm = cache.block_manager
    shared = bm.share(holder, seq.block_tables, final_tokens(state, mtp))
    while not bm.can_allocate(holder, at) and make_room():
        pass
    if not bm.can_allocate(holder, at):
        bm.free(holder)
        return None
    bm.allocate(holder, at)
    holder.num_computed_tokens = at
    copy = fork_state(state, holder)
    copy_rest(cache.pools, seq.block_tables, holder.block_tables, shared)  # after the step's forward
    return holder, copy


class PrefixSnapshots:
    def __init__(self, capacity: int, cache, mtp: bool = False):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"PrefixSnapshots: capacity={capacity!r}; expected an integer >= 1")
        self.capacity, self.cache, self.mtp = capacity, cache, mtp
        self._seen: OrderedDict[int, str] = OrderedDict()  # block-chain hash -> the first request that had it
        # prefix tokens (tuple) -> (the same as a list -- one token more under speculation, see `take` --, pages
        # holder, state): least recently used first
        self.entries: OrderedDict[tuple, tuple[list[int], PageHolder, object]] = OrderedDict()
        self._names = itertools.count()
        self.num_taken = 0

    def __len__(self) -> int:
        return len(self.entries)

    @staticmethod
    def _chain(tokens: list[int]) -> list[int]:
        out, h = [], 0
        for end in range(SNAPSHOT_BLOCK, len(tokens) + 1, SNAPSHOT_BLOCK):
            h = hash((h, tuple(tokens[end - SNAPSHOT_BLOCK: end])))
            out.append(h)
        return out

    def note(self, seq: Sequence) -> int:
        """Remember `seq`'s prompt blocks; return where seq should stop a prefill chunk to be snapshotted: the end
        of the longest block-aligned prefix of its prompt (its last token excluded) that another request's prompt
        had, if seq has not computed that far and no snapshot holds it; else 0."""
        prompt = seq.prompt_token_ids
        at, shared = 0, True
        for i, h in enumerate(self._chain(prompt[:-1])):
            owner = self._seen.get(h)
            if owner is None:
                shared = False
                self._seen[h] = seq.request_id
            else:
                self._seen.move_to_end(h)
                if shared and owner != seq.request_id:
                    at = (i + 1) * SNAPSHOT_BLOCK
        while len(self._seen) > MAX_HASHES:
            self._seen.popitem(last=False)
        if at <= seq.num_computed_tokens or tuple(prompt[:at]) in self.entries:
            return 0
        return at

    def take(self, seq: Sequence, state) -> None:
        """Keep a copy of `seq`'s state and pages, which has just computed up to `seq.snapshot_at` (nothing where
        a snapshot of those tokens exists, or the pages do not fit even without the snapshot that a full capacity
        would evict)."""
        at, seq.snapshot_at = seq.snapshot_at, 0
        key = tuple(seq.token_ids[:at])
        if (key in self.entries or state.num_tokens != at
                or (self.mtp and state.mtp.num_tokens != at)):
            return
        # at capacity the least recently used snapshot goes anyway: first, where the new one needs its pages
        made = copy_into(self.cache, f"snapshot-{next(self._names)}", seq, state, self.mtp,
                         lambda: len(self.entries) >= self.capacity and self.evict_oldest())
        if made is None:
            return
        # the tokens a fork compares: under speculation also the one the MTP state's last row was fed (the prompt's
        # next; `PromptSharing._fork_point`), so a prompt that goes on with it takes the whole snapshot
        self.entries[key] = (list(seq.token_ids[:at + 1] if self.mtp else key), *made)
        self.num_taken += 1
        while len(self.entries) > self.capacity and self.evict_oldest():
            pass

    def touch(self, holder: PageHolder) -> None:
        """Mark the snapshot of `holder` as used now (least recently used goes first)."""
        for key, (_, h, _) in self.entries.items():
            if h is holder:
                self.entries.move_to_end(key)
                return

    def evict_oldest(self) -> bool:
        """Free the least recently used snapshot's pages (those shared with forks stay theirs); False if none is
        kept. (A fork recorded in this step still copies from them correctly: `PromptSharing.flush` runs the copies
        in order before anything else writes, and a page freed here is allocated only to a later fork or chunk.)"""
        if not self.entries:
            return False
        _, (_, holder, _) = self.entries.popitem(last=False)
        self.cache.block_manager.free(holder)
        return True

    def clear(self) -> None:
        while self.evict_oldest():
            pass
