"""Requests with the same prompt (n choices, one prompt sent several times) compute it once.

A fresh request whose prompt starts with the whole prompt of a running sequence that is still computing it
*waits* (the scheduler admits nobody after it in that step). Once the source has computed its prompt, the request
*forks* it: it gets pages of its own holding copies of the source's (`PagedPools.copy_pages`) and a decode state
with the source's counters, rolled back so that the request still computes at least its last prompt token itself
(its first token is sampled from its own logits, with its own seed and penalties). The source's full pages of
compressed entries and indexer keys below the point neither can roll back past (`final_tokens`) are shared (counted
holders, `BlockManager.share`); the window ring, the compressors' state and the rest are copied. So no page is
ever written while two hold it, and the hybrid cache needs no copy-on-write.

A fork only reaches back `max_rollback` tokens into the source's state (the window ring and the compressors' raw
rows keep no more), so it must happen in the source's first decode steps: a request arriving later prefills as
usual. Requests asking for `prompt_logprobs` neither wait nor fork (their prompt is scored from its first token).
With speculative decoding the fork point is also at most the source's MTP state length, and both states of the
copy are rolled back to it. Prefix snapshots (dsv4.engine.prefix_snapshots) are forked the same way, and so are
retained sequences (dsv4.engine.retention, `fork_from`: counted there as adoptions).
"""
from __future__ import annotations

from .prefix_snapshots import PrefixSnapshots, copy_rest, final_tokens, fork_state
from .sequence import Sequence

MIN_SHARED_TOKENS = 16  # shorter prompts are computed again: waiting a step would cost more than it saves


def _tables(block_tables: dict[str, list[int]]) -> dict[str, list[int]]:
    return {kind: list(pages) for kind, pages in block_tables.items()}


class PromptSharing:
    """The engine's hooks: `source_computing` (wait?), `fork` (copy a running sequence's or a prefix snapshot's
    cache), `undo` (take a fork back) and `flush` (run this step's copies)."""

    def __init__(self, cache, mtp: bool = False, snapshots: PrefixSnapshots | None = None):
        self.cache = cache  # HybridCache: its states, block manager and pools
        self.mtp = mtp
        self.snapshots = snapshots  # prefix snapshots, forked as running sequences are (dsv4.engine.prefix_snapshots)
        self.num_forks = 0           # requests that forked a running sequence or a snapshot
        self.num_tokens_shared = 0   # prompt tokens they did not compute
        # this step's forks: (the source's pages, the fork's pages as allocated by `fork`, pages shared per kind,
        # the fork, whether counted in num_forks / num_tokens_shared)
        self._copies: list[tuple[dict[str, list[int]], dict[str, list[int]], dict[str, int], Sequence, bool]] = []

    @staticmethod
    def _starts_with(seq: Sequence, src: Sequence, n: int) -> bool:
        """Whether `seq`'s prompt starts with `src`'s first n tokens."""
        return n <= seq.num_prompt_tokens and seq.token_ids[:n] == src.token_ids[:n]

    def source_computing(self, seq: Sequence, running: list[Sequence]) -> bool:
        """Whether a running sequence is still computing a prompt (of at least MIN_SHARED_TOKENS tokens) that
        `seq`'s prompt starts with, or a prefix of seq's prompt it will keep as a snapshot: `seq` should wait for it
        and fork it (or the snapshot) then."""
        for src in running:
            if (src.num_output_tokens == 0 and MIN_SHARED_TOKENS <= src.num_prompt_tokens
                    and src.num_computed_tokens < src.num_prompt_tokens
                    and self._starts_with(seq, src, src.num_prompt_tokens)):
                return True
            at = src.snapshot_at
            if src.num_computed_tokens < at < seq.num_prompt_tokens and self._starts_with(seq, src, at):
                return True
        return False

    def _fork_point(self, seq: Sequence, tokens: list[int], state) -> int:
        """Tokens of a source's state (holding `tokens`) that `seq` can take over: a common prefix, short of seq's
        last prompt token, within reach of a rollback of both the backbone and (speculative decoding) the MTP state;
        0: none. The MTP state's row of position i was fed token i + 1, so under speculation the token after the
        fork point must be common too: a source that does not list it (a key of exactly the state's tokens) forks
        one token earlier, and seq computes that token again."""
        n = min(state.num_tokens, seq.num_prompt_tokens - 1, len(tokens))
        if self.mtp:
            n = min(n, state.mtp.num_tokens, len(tokens) - 1)
        layers = [*state.layers, *([state.mtp] if self.mtp else [])]
        reach = max(MIN_SHARED_TOKENS, max(layer.min_length for layer in layers))
        if n < reach:  # checked before the tokens: most running sequences decode far past any waiting prompt
            return 0
        a, b = seq.prompt_token_ids, tokens
        last = n + 1 if self.mtp else n  # (under speculation a[n] exists: n < seq.num_prompt_tokens)
        if a[:last] != b[:last]:
            n = next(i for i in range(last) if a[i] != b[i]) - (1 if self.mtp else 0)
        return n if n >= reach else 0

    def fork(self, seq: Sequence, running: list[Sequence]):
        """Give fresh, waiting `seq` a copy of the longest usable prefix of a running sequence's cache or of a
        prefix snapshot: pages allocated and filled, seq's first tokens counted as computed. Returns seq's decode
        state, or None (nothing allocated) where no source has one, or its pages do not fit."""
        if seq.num_computed_tokens or seq.block_tables:
            raise ValueError(f"request {seq.request_id!r}: only a fresh sequence can fork a running one")
        sources = [(src.token_ids, src, self.cache.states.get(src.request_id)) for src in running]
        if self.snapshots is not None:
            sources += self.snapshots.entries.values()
        best, best_n = None, 0
        for tokens, owner, state in sources:
            n = 0 if state is None else self._fork_point(seq, tokens, state)
            if n > best_n:
                best, best_n = (owner, state), n
        if best is None:
            return None
        copy = self._take(seq, *best, best_n, counted=True)
        if copy is not None and self.snapshots is not None:
            self.snapshots.touch(best[0])  # (a running sequence is no snapshot: nothing happens)
        return copy

    def fork_from(self, seq: Sequence, tokens: list[int], holder, state):
        """`fork` from one given source (a retained sequence, dsv4.engine.retention), not counted as a fork here;
        None where seq cannot take it over or its pages do not fit."""
        if seq.num_computed_tokens or seq.block_tables:
            raise ValueError(f"request {seq.request_id!r}: only a fresh sequence can fork a retained one")
        n = self._fork_point(seq, tokens, state)
        return self._take(seq, holder, state, n, counted=False) if n else None

    def _take(self, seq: Sequence, src, state, n: int, counted: bool):
        """Give seq the first n tokens of `src`'s cache (its final entry pages shared, the rest copied at `flush`)
        and a copy of `state` rolled back to them; None (nothing held) where the pages do not fit."""
        bm = self.cache.block_manager
        shared = bm.share(seq, src.block_tables, final_tokens(state, self.mtp))
        if not bm.can_allocate(seq, n):
            bm.free(seq)
            return None
        copy = fork_state(state, seq)
        copy.truncate(copy.num_tokens - n)
        if self.mtp:
            copy.mtp.truncate(copy.mtp.num_tokens - n)
        bm.allocate(seq, n)
        # copied in `flush`, once the scheduler has kept seq: a fork taken back costs no copy
        self._copies.append((_tables(src.block_tables), _tables(seq.block_tables), shared, seq, counted))
        seq.num_computed_tokens = n
        if counted:
            self.num_forks += 1
            self.num_tokens_shared += n
        return copy

    def flush(self) -> None:
        """Copy the pages of this step's forks, in the order they were made, before the step's forward writes to
        any page: each source's pages are as they were at its fork (a source's page freed after its fork, e.g. an
        evicted snapshot's, can only have gone to a later fork, whose copy comes after)."""
        for src_pages, pages, shared, _, _ in self._copies:
            copy_rest(self.cache.pools, src_pages, pages, shared)
        self._copies.clear()

    def undo(self, seq: Sequence) -> bool:
        """Take back the fork of waiting `seq` that then did not fit (its pages freed, nothing computed); False
        if seq's cache did not come from the latest fork."""
        if not self._copies or self._copies[-1][3] is not seq:
            return False
        counted = self._copies.pop()[4]
        self.cache.block_manager.free(seq)
        self.cache.release(seq)
        if counted:
            self.num_forks -= 1
            self.num_tokens_shared -= seq.num_computed_tokens
        seq.num_computed_tokens = 0
        return True
