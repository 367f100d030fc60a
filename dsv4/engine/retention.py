"""Finished sequences' cache kept for a prompt that continues them (the next turn of a conversation).

With `EngineConfig.retain_finished = N` (0: off) up to N finished sequences keep their pages and decode state,
keyed by the tokens that state holds. A new request whose prompt extends one of them by at least one token
*adopts* it and then prefills only the rest of its prompt. With prompt sharing on (the default) the adopter *forks*
the retained sequence (dsv4.engine.prompt_sharing: its final entry pages shared, the window ring, compressor state
and last pages copied), and the entry stays -- evicted before the entries never forked -- so another continuation
of the same turn (a regenerated reply, a branch, a retried agent step) finds it too; where the fork's pages do not
fit, or sharing is off, the pages and the state *move* to the adopter (no copy; one continuation). Adoption happens
when the scheduler admits the request; a request that then does not fit gives the cache back (`give_back`), so no
waiting request ever holds pages. Retained pages give way first when pages run out (forked entries, least recently
forked first -- a forked entry's sibling from the same request, see below, just before it -- then the oldest),
before any running sequence is preempted.

A request can also name a point of its prompt to retain (`SamplingParams.retain_prefix`, set by the chat routes):
a prefill chunk ends there and a copy of the cache at that point is kept (`keep_prefix`). At the prompt's end it is
the fallback for a next turn that tokenizes the reply differently than the model produced it (a tool call's
"t"+"rue" comes back as "tr"+"ue": the finished sequence is no prefix of it, the prompt still is). Short of the end
it replaces the finished sequence's cache: thinking mode drops the reasoning from the history and re-renders the
generation prompt, so the next turn starts with this prompt but its last token.

Not used for requests asking for `prompt_logprobs` (their prompt is scored from its first token). With
speculative decoding the MTP state is not advanced over a sequence's finishing step: the target state is rolled
back to the MTP's length on retention (at most the last step's 1 + k tokens), so the adopter's first chunk feeds
the MTP from where it stopped. The MTP state's last row was fed the token after the entry's (row i takes token
i + 1): an adopter whose prompt goes on with another one takes a token less and computes that row again.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Callable

from .block_manager import PageHolder
from .prefix_snapshots import copy_into
from .sequence import Sequence


def _repoint(state, owner) -> None:
    for layer in [*state.layers, *([state.mtp] if state.mtp is not None else [])]:
        layer.seq = owner  # the paged layer states read their block tables through it


def _token_at(seq: Sequence, i: int) -> int | None:
    return seq.token_ids[i] if i < len(seq.token_ids) else None


class RetainedSequences:
    """Finished sequences holding their pages, oldest first; `adopt` hands one to a request that extends it."""

    def __init__(self, capacity: int, cache, mtp: bool = False):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"RetainedSequences: capacity={capacity!r}; expected an integer >= 1")
        self.capacity = capacity
        self.cache = cache  # HybridCache: its block manager and pools
        self.block_manager = cache.block_manager
        self.mtp = mtp  # speculative decoding: the target state must end level with its MTP state
        self._entries: OrderedDict[int, tuple[tuple[int, ...], PageHolder, object]] = OrderedDict()
        self._keys = itertools.count()
        self.num_adopted = 0          # requests that adopted a retained sequence
        self.num_tokens_reused = 0    # prompt tokens they did not compute again
        # with prompt sharing on (the engine sets it: PromptSharing.fork_from), an adopter forks the retained
        # sequence instead of taking it: the entry stays for another continuation (a regenerated reply, a branch)
        self.fork: Callable | None = None
        self._forked: Sequence | None = None  # the latest adopter that forked (for `undo_fork`)
        # entries forked at least once, least recently first: they go before the others (a conversation goes on from
        # its newest turn, which the adopter becomes once retained)
        self._spent: OrderedDict[int, None] = OrderedDict()
        self._turns: dict[int, str] = {}  # entry -> the request it came from (its prompt-end copy and its end)
        # entry -> the token after its tokens (None: not known). Under speculation the MTP state's last row was fed
        # it (row i takes token i + 1): an adopter whose prompt goes on with another token takes one token less
        self._after: dict[int, int | None] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, seq: Sequence, state) -> None:
        """Retain finished `seq` (its pages) with its decode `state` (None: nothing to keep; the pages are freed).
        The key is the tokens the state holds: the computed ones, and the last sampled one too where a look-ahead
        step fed it before the stop was seen. A state (or MTP state) longer than the sequence's tokens (accepted
        drafts after a stop) or than its MTP state is rolled back first; where it cannot be (deeper than it keeps),
        it is freed."""
        n = 0 if state is None else min(len(seq.token_ids), state.mtp.num_tokens if self.mtp else state.num_tokens)
        if state is not None and 0 < n:
            try:
                if n < state.num_tokens:
                    state.truncate(state.num_tokens - n)
                if self.mtp and n < state.mtp.num_tokens:  # a stop among the drafts the MTP caught up on
                    state.mtp.truncate(state.mtp.num_tokens - n)
            except ValueError:  # e.g. a sequence that finished in its prefill step: the MTP never saw that chunk
                n = 0
        if n == 0:
            self.block_manager.free(seq)
            return
        self._hold(seq.token_ids[:n], seq, state, _token_at(seq, n))

    def keep_prefix(self, seq: Sequence, state) -> None:
        """Retain a copy of running `seq`'s cache, which has just computed up to `seq.retain_at` (nothing where an
        entry holds those tokens, the MTP state is not level with it (at the prompt's end it waits for the first
        token), or the copy does not fit even after the retained entries beyond a full capacity went)."""
        at, seq.retain_at = seq.retain_at, 0
        tokens = tuple(seq.token_ids[:at])
        if (any(entry[0] == tokens for entry in self._entries.values()) or state.num_tokens != at
                or (self.mtp and state.mtp.num_tokens != at)):
            return
        made = copy_into(self.cache, f"retained-{seq.request_id}", seq, state, self.mtp,
                         lambda: len(self._entries) >= self.capacity and self.evict_oldest())
        if made is not None:
            self._add(tokens, *made, turn=seq.request_id, after=_token_at(seq, at))

    def give_back(self, seq: Sequence, state) -> None:
        """Undo `adopt` for a waiting `seq` that did not fit: its cache becomes the newest retained entry again and
        seq is fresh (nothing computed, no pages)."""
        n = seq.num_computed_tokens
        self._hold(seq.token_ids[:n], seq, state, _token_at(seq, n))
        seq.num_computed_tokens = 0
        self.num_adopted -= 1
        self.num_tokens_reused -= n

    def undo_fork(self, seq: Sequence) -> None:
        """Uncount the adoption of waiting `seq` whose fork was taken back (PromptSharing.undo freed its pages)."""
        if self._forked is seq:
            self._forked = None
            self.num_adopted -= 1
            self.num_tokens_reused -= seq.num_computed_tokens

    def _hold(self, tokens, seq: Sequence, state, after: int | None) -> None:
        holder = PageHolder(seq.request_id, seq.block_tables)
        seq.block_tables = {}
        _repoint(state, holder)
        self._add(tuple(tokens), holder, state, turn=seq.request_id, after=after)

    def _add(self, tokens: tuple[int, ...], holder: PageHolder, state, turn: str, after: int | None) -> None:
        key = next(self._keys)
        self._entries[key] = (tokens, holder, state)
        self._turns[key] = turn
        self._after[key] = after
        while len(self._entries) > self.capacity:
            self.evict_oldest()

    def eviction_order(self) -> list[tuple[int, ...]]:
        """The retained sequences' tokens, the next to be evicted first."""
        return [self._entries[k][0] for k in [*self._spent, *(k for k in self._entries if k not in self._spent)]]

    def evict_oldest(self) -> bool:
        """Free a retained sequence's pages: the least recently forked one, else the oldest; False if none is
        retained."""
        if not self._entries:
            return False
        key = self._spent.popitem(last=False)[0] if self._spent else next(iter(self._entries))
        _, holder, _ = self._entries.pop(key)
        del self._turns[key], self._after[key]
        self.block_manager.free(holder)
        return True

    def clear(self) -> None:
        while self.evict_oldest():
            pass

    def adopt(self, seq: Sequence):
        """Give `seq` (a waiting, not yet scheduled sequence) the longest retained sequence its prompt extends: a
        fork of it (`fork`, the entry stays) or, where that does not fit, the sequence itself (its pages become
        seq's); its tokens count as computed. Returns seq's decode state, or None where no retained sequence fits."""
        if seq.num_computed_tokens or seq.block_tables:
            raise ValueError(f"request {seq.request_id!r}: only a fresh sequence can adopt a retained one")
        prompt = seq.prompt_token_ids
        # an entry of the whole prompt (a prompt sent again: a regenerated reply) can only be forked: the fork rolls
        # back a token, so that seq computes its last prompt token itself
        most = len(prompt) if self.fork is not None else len(prompt) - 1
        best, best_len = None, 0
        for key, (tokens, _, _) in self._entries.items():
            n = len(tokens)
            if best_len < n <= most and tuple(prompt[:n]) == tokens:
                best, best_len = key, n
        if best is None:
            return None
        tokens, holder, state = self._entries[best]
        after = self._after[best]
        listed = [*tokens, after] if self.mtp and after is not None else list(tokens)  # (`_fork_point` compares them)
        forked = self.fork(seq, listed, holder, state) if self.fork is not None else None
        if forked is not None:
            # the turn's other entry (its prompt-end copy, or its end where that was forked) goes before this one
            turn = self._turns[best]
            for key in [*(k for k, t in self._turns.items() if t == turn and k != best), best]:
                self._spent[key] = None
                self._spent.move_to_end(key)
            self._forked = seq
            self.num_adopted += 1
            self.num_tokens_reused += seq.num_computed_tokens
            return forked
        n = len(tokens)
        if n == len(prompt):
            return None
        if self.mtp and after != prompt[n]:  # the MTP state's last row was fed another token (or one not known)
            if max(layer.min_length for layer in [*state.layers, state.mtp]) > n - 1:
                return None  # (at the floor of its rollback: rare, the last step rolled back as far as it keeps)
            n -= 1
            state.truncate(state.num_tokens - n)
            state.mtp.truncate(state.mtp.num_tokens - n)
        del self._entries[best]
        del self._turns[best], self._after[best]
        self._spent.pop(best, None)
        seq.block_tables, holder.block_tables = holder.block_tables, {}
        seq.num_computed_tokens = n
        _repoint(state, seq)
        self.num_adopted += 1
        self.num_tokens_reused += n
        return state
