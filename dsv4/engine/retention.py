"""Finished sequences' cache kept for a prompt that continues them (the next turn of a conversation).

With `EngineConfig.retain_finished = N` (0: off) up to N finished sequences keep their pages and decode state,
keyed by the tokens that state holds. A new request whose prompt extends one of them by at least one token
*adopts* it: the pages and the state move to the new request, which then prefills only the rest of its prompt.
Move, not share: one continuation per retained sequence, so no page is ever written by two sequences and the
hybrid cache (window ring, compressor rows, compressed entries) needs no copy-on-write. Adoption happens when the
scheduler admits the request; a request that then does not fit gives the cache back (`give_back`), so no waiting
request ever holds pages. Retained pages give way first when pages run out (the oldest retained first), before
any running sequence is preempted.

Not used for requests asking for `prompt_logprobs` (their prompt is scored from its first token). With
speculative decoding the MTP state is not advanced over a sequence's finishing step: the target state is rolled
back to the MTP's length on retention (at most the last step's 1 + k tokens), so the adopter's first chunk feeds
the MTP from where it stopped.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict

from .block_manager import BlockManager, PageHolder
from .sequence import Sequence


def _repoint(state, owner) -> None:
    for layer in [*state.layers, *([state.mtp] if state.mtp is not None else [])]:
        layer.seq = owner  # the paged layer states read their block tables through it


class RetainedSequences:
    """Finished sequences holding their pages, oldest first; `adopt` hands one to a request that extends it."""

    def __init__(self, capacity: int, block_manager: BlockManager, mtp: bool = False):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"RetainedSequences: capacity={capacity!r}; expected an integer >= 1")
        self.capacity = capacity
        self.block_manager = block_manager
        self.mtp = mtp  # speculative decoding: the target state must end level with its MTP state
        self._entries: OrderedDict[int, tuple[tuple[int, ...], PageHolder, object]] = OrderedDict()
        self._keys = itertools.count()
        self.num_adopted = 0          # requests that adopted a retained sequence
        self.num_tokens_reused = 0    # prompt tokens they did not compute again

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, seq: Sequence, state) -> None:
        """Retain finished `seq` (its pages) with its decode `state` (None: nothing to keep; the pages are freed).
        The key is the tokens the state holds: the computed ones, and the last sampled one too where a look-ahead
        step fed it before the stop was seen. A state longer than the sequence's tokens (accepted drafts after a
        stop) or than its MTP state is rolled back first; where it cannot be (deeper than it keeps), it is freed."""
        n = 0 if state is None else min(len(seq.token_ids), state.mtp.num_tokens if self.mtp else state.num_tokens)
        if state is not None and 0 < n < state.num_tokens:
            try:
                state.truncate(state.num_tokens - n)
            except ValueError:  # e.g. a sequence that finished in its prefill step: the MTP never saw that chunk
                n = 0
        if n == 0:
            self.block_manager.free(seq)
            return
        self._hold(seq.token_ids[:n], seq, state)

    def give_back(self, seq: Sequence, state) -> None:
        """Undo `adopt` for a waiting `seq` that did not fit: its cache becomes the newest retained entry again and
        seq is fresh (nothing computed, no pages)."""
        n = seq.num_computed_tokens
        self._hold(seq.token_ids[:n], seq, state)
        seq.num_computed_tokens = 0
        self.num_adopted -= 1
        self.num_tokens_reused -= n

    def _hold(self, tokens, seq: Sequence, state) -> None:
        holder = PageHolder(seq.request_id, seq.block_tables)
        seq.block_tables = {}
        _repoint(state, holder)
        self._entries[next(self._keys)] = (tuple(tokens), holder, state)
        while len(self._entries) > self.capacity:
            self.evict_oldest()

    def evict_oldest(self) -> bool:
        """Free the oldest retained sequence's pages; False if none is retained."""
        if not self._entries:
            return False
        _, (_, holder, _) = self._entries.popitem(last=False)
        self.block_manager.free(holder)
        return True

    def clear(self) -> None:
        while self.evict_oldest():
            pass

    def adopt(self, seq: Sequence):
        """Move the longest retained sequence that `seq`'s prompt extends into `seq` (a waiting, not yet scheduled
        sequence): its pages become seq's, its tokens count as computed. Returns the decode state, now seq's,
        or None where no retained sequence fits."""
        if seq.num_computed_tokens or seq.block_tables:
            raise ValueError(f"request {seq.request_id!r}: only a fresh sequence can adopt a retained one")
        prompt = seq.prompt_token_ids
        best, best_len = None, 0
        for key, (tokens, _, _) in self._entries.items():
            n = len(tokens)
            if best_len < n < len(prompt) and tuple(prompt[:n]) == tokens:
                best, best_len = key, n
        if best is None:
            return None
        tokens, holder, state = self._entries.pop(best)
        seq.block_tables, holder.block_tables = holder.block_tables, {}
        seq.num_computed_tokens = len(tokens)
        _repoint(state, seq)
        self.num_adopted += 1
        self.num_tokens_reused += len(tokens)
        return state
