"""Continuous-batching scheduler: chunked prefill under a token budget, decode batching,
preemption by recompute when pages run out.

Order: by (SamplingParams.priority, arrival) -- lower priority values first (vLLM's convention), then first
come, first served. With every priority equal (the default 0) this is arrival order.

Policy per step (budget = max_num_batched_tokens):
  1. running sequences in order each get min(remaining, budget) tokens, where remaining =
     num_tokens - num_computed_tokens (1 for a decode, the rest of the prompt for a prefill). When
     the pages do not fit, the last running sequence in order (the latest arrival of the lowest priority) is
     preempted (pages freed, cache forgotten, put back into the waiting queue in order; its generated tokens are
     kept and are recomputed as part of its next prefill) until they fit, or the sequence itself was the victim.
     With speculation (num_draft_tokens = k), a decode row also reserves pages and budget for up to
     k draft tokens, fewer when the budget, the pages, max_tokens or max_model_len leave no room;
  2. if nobody was preempted, waiting sequences are admitted in order while the budget, the page
     pools and max_num_seqs allow (no skipping ahead: the head blocks the queue). Where the head does not fit
     (pages or max_num_seqs) and a running sequence goes after it in order -- only where priorities differ --
     that sequence is preempted for it, the last one first, its row taken out of this step's batch.
Retained finished sequences (dsv4.engine.retention) and prefix snapshots give their pages back before either
preempts or blocks. A waiting head whose prompt a running sequence is still computing waits for it
(dsv4.engine.prompt_sharing), and a prefill chunk ends early at a sequence's snapshot point (`_chunk`).
A single sequence of max_model_len tokens must fit the pools (checked at construction), so the first running
sequence always makes progress.

Look-ahead (`schedule_continuation`, the engine's overlap of host and GPU work): while a batch's sampled ids
are still on the device, its sampled rows may be continued by one token each, before `postprocess` has
seen the ids; the two batches are then in flight and are postprocessed in order. A continuation row whose
sequence stops at the earlier batch is skipped by `postprocess`, as a row aborted after scheduling is.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence as Seq

import torch

from dsv4.engine.block_manager import BlockManager
from dsv4.engine.sequence import Detokenize, Sequence, SequenceStatus


def _positive_int(owner: str, name: str, value, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{owner}.{name}={value!r}; expected an integer >= {minimum}")


def _order(seq: Sequence) -> tuple[int, int]:
    return seq.params.priority, seq.arrival


def _insert(queue, seq: Sequence) -> None:
    """Put seq into `queue` (a list or deque in order) after every sequence that goes before it. From the back:
    an arrival, or a victim of preemption, usually goes last or close to it."""
    key, i = _order(seq), len(queue)
    while i and _order(queue[i - 1]) > key:
        i -= 1
    queue.insert(i, seq)


def _chunk(seq: Sequence, remaining: int, budget: int) -> int:
    """Tokens of `seq` to compute in this step: what remains, within the budget, ending at a snapshot or retain
    point."""
    n = min(remaining, budget)
    for point in (seq.snapshot_at, seq.retain_at):
        if seq.num_computed_tokens < point:
            n = min(n, point - seq.num_computed_tokens)
    return n


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256              # running sequences (= rows of a batch) at most
    max_num_batched_tokens: int = 8192   # tokens computed per step at most
    max_model_len: int = 4096            # prompt + output tokens at most
    num_draft_tokens: int = 0            # speculative draft slots reserved per decode row (0 = off)

    def __post_init__(self) -> None:
        _positive_int("SchedulerConfig", "max_num_seqs", self.max_num_seqs)
        _positive_int("SchedulerConfig", "max_num_batched_tokens", self.max_num_batched_tokens)
        _positive_int("SchedulerConfig", "max_model_len", self.max_model_len, minimum=2)
        _positive_int("SchedulerConfig", "num_draft_tokens", self.num_draft_tokens, minimum=0)


@dataclass
class ScheduledSeq:
    """The model computes seq.token_ids[start : start + num_tokens] at positions start, start + 1, ...
    with the cache holding positions [0, start). When `sample`, the chunk ends at the sequence's last
    known token and the logits of its last position are sampled.

    Speculative decode rows reserve `num_draft_tokens` more positions (pages and budget); the
    speculator fills `draft_token_ids` (at most that many), which the model computes after the
    row's own token, and the logits of every draft position are verified too."""
    seq: Sequence
    start: int
    num_tokens: int
    sample: bool
    num_draft_tokens: int = 0
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def is_decode(self) -> bool:
        """One new token on top of a non-empty cache, sampled, no drafts: the decode-kernel case."""
        return self.num_tokens == 1 and self.start > 0 and self.sample and not self.num_draft_tokens

    @property
    def is_prefill(self) -> bool:
        return not self.is_decode

    @property
    def token_ids(self) -> list[int]:
        """What the model computes: the chunk, then the draft tokens (if any)."""
        return self.seq.token_ids[self.start: self.start + self.num_tokens] + self.draft_token_ids


@dataclass
class ScheduledBatch:
    rows: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)  # preempted while building this batch
    # drafts still on the device (MTPSpeculator.propose's greedy path): every draft of the rows, in row order,
    # while the rows' draft_token_ids hold placeholders of the same length until the verify reads them back
    draft_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens + len(r.draft_token_ids) for r in self.rows)

    @property
    def seqs(self) -> list[Sequence]:
        return [r.seq for r in self.rows]


@dataclass
class SchedulerStats:
    num_waiting: int
    num_running: int
    num_preemptions: int        # since construction
    usage: dict[str, float]     # fraction of pages in use, per kind


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 eos_token_ids: int | Iterable[int] | None = None,
                 detokenize: Detokenize | None = None) -> None:
        if not block_manager.fits_alone(config.max_model_len):
            raise ValueError(f"SchedulerConfig.max_model_len={config.max_model_len}: one sequence of that "
                             f"length does not fit the page pools; lower it or add pages")
        self.config = config
        self.block_manager = block_manager
        if eos_token_ids is None:
            eos_token_ids = ()
        elif isinstance(eos_token_ids, int):
            eos_token_ids = (eos_token_ids,)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.detokenize = detokenize
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.requests: dict[str, Sequence] = {}   # unfinished, by request id
        self.num_preemptions = 0
        self._arrivals = itertools.count()
        self._in_flight: list[ScheduledBatch] = []  # scheduled, not postprocessed yet, oldest first
        # dsv4.engine.retention, through the engine: finished sequences keep their pages (the engine retains or
        # frees them); `reclaim()` frees retained (or snapshot) pages, oldest first (False: none left), before
        # anybody is preempted or blocked; `adopt(seq)` may give the waiting head a retained cache as it is
        # admitted, and `give_back(seq)` undoes that where it then does not fit (no waiting sequence holds pages).
        # The same hooks let the head copy a running sequence's or a snapshot's cache (dsv4.engine.prompt_sharing);
        # `adopt` returns False where the head should wait for that (nobody else is admitted in this step)
        self.keep_finished = False
        self.reclaim: Callable[[], bool] = lambda: False
        self.adopt: Callable[[Sequence], bool] = lambda seq: True
        self.give_back: Callable[[Sequence], None] = lambda seq: None

    # ---- requests ------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        rid = seq.request_id
        if rid in self.requests:
            raise ValueError(f"request {rid!r}: a request with this id is already active")
        if seq.status != SequenceStatus.WAITING or seq.num_computed_tokens or seq.num_output_tokens:
            raise ValueError(f"request {rid!r}: only fresh sequences can be added")
        if seq.num_prompt_tokens >= self.config.max_model_len:
            raise ValueError(f"request {rid!r}: prompt has {seq.num_prompt_tokens} tokens; max_model_len="
                             f"{self.config.max_model_len} allows at most {self.config.max_model_len - 1}")
        if seq.params.stop and self.detokenize is None:
            raise ValueError(f"request {rid!r}: stop strings need a scheduler built with detokenize")
        seq.arrival = next(self._arrivals)
        self.requests[rid] = seq
        _insert(self.waiting, seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Finish a request with reason "abort" and free its pages; None if it is not active."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return None
        if seq.status == SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.finish("abort")
        return seq

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(len(self.waiting), len(self.running), self.num_preemptions,
                              self.block_manager.usage())

    # ---- steps ---------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        if self._in_flight:
            raise RuntimeError("Scheduler.schedule: the previous batch was not postprocessed")
        bm = self.block_manager
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            remaining = seq.num_tokens - seq.num_computed_tokens
            n = _chunk(seq, remaining, budget)
            k = self._num_drafts(seq, remaining, budget)
            while k and not bm.can_allocate(seq, n + k):  # drafts never preempt anybody
                k -= 1
            while not bm.can_allocate(seq, n):
                if self.reclaim():
                    continue
                victim = self.running.pop()  # the last in order: latest arrival of the lowest priority
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status != SequenceStatus.RUNNING:
                break
            bm.allocate(seq, n + k)
            batch.rows.append(ScheduledSeq(seq, seq.num_computed_tokens, n, n == remaining, k))
            budget -= n + k
            i += 1

        outranked = False  # a running sequence made way for a higher-priority one in this loop
        while (self.waiting and budget > 0 and (outranked or not batch.preempted)):
            seq = self.waiting[0]
            if len(self.running) >= self.config.max_num_seqs:
                freed = self._make_way(seq, batch)
                if freed is None:
                    break
                outranked, budget = True, budget + freed
            if not seq.num_computed_tokens and not self.adopt(seq):
                break  # a running sequence is computing seq's prompt: seq copies its cache in a later step
            remaining = seq.num_tokens - seq.num_computed_tokens
            n = _chunk(seq, remaining, budget)
            if not bm.can_allocate(seq, n):
                if self.reclaim():
                    continue
                freed = self._make_way(seq, batch)
                if freed is not None:
                    outranked, budget = True, budget + freed
                    continue
                if seq.num_computed_tokens:
                    self.give_back(seq)
                break
            bm.allocate(seq, n)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            _insert(self.running, seq)
            batch.rows.append(ScheduledSeq(seq, seq.num_computed_tokens, n, n == remaining))
            budget -= n

        if batch.rows:
            self._in_flight.append(batch)
        return batch

    def _make_way(self, seq: Sequence, batch: ScheduledBatch) -> int | None:
        """Preempt the last running sequence for waiting `seq` if it goes after seq in order (a lower priority; never
        with equal priorities, where every running sequence arrived first). Its row leaves `batch`: returns the
        budget that row held, or None where nobody runs after seq."""
        if not self.running or _order(self.running[-1]) <= _order(seq):
            return None
        victim = self.running.pop()
        at = next((i for i, r in enumerate(batch.rows) if r.seq is victim), None)  # (identity: rows compare equal)
        row = batch.rows.pop(at) if at is not None else None
        self._preempt(victim)
        batch.preempted.append(victim)
        return 0 if row is None else row.num_tokens + row.num_draft_tokens

    def schedule_continuation(self, rows: list[ScheduledSeq]) -> ScheduledBatch | None:
        """One more token for each of `rows` (sampled rows of the one batch in flight, whose ids the host has
        not seen yet) that goes on whatever its id is: a decode row at the position after the row's chunk.
        Rows of finished sequences, and rows that max_tokens or max_model_len ends at that id, are left out.
        None, with nothing allocated, unless such rows remain, no sequence waits and the pages of every
        continuation fit (a look-ahead never preempts)."""
        if len(self._in_flight) != 1 or self.waiting:
            return None
        if any(not r.sample or r.num_draft_tokens for r in rows):
            raise ValueError("Scheduler.schedule_continuation: only sampled rows without drafts continue")
        rows = [r for r in rows if not r.seq.is_finished and self._goes_on(r.seq)]
        if not rows:
            return None
        # the row's own tokens are not counted as computed yet: its chunk and the next token, from num_computed
        if not self.block_manager.can_allocate_all((r.seq, r.num_tokens + 1) for r in rows):
            return None
        batch = ScheduledBatch()
        for r in rows:
            self.block_manager.allocate(r.seq, r.num_tokens + 1)
            batch.rows.append(ScheduledSeq(r.seq, r.start + r.num_tokens, 1, True))
        self._in_flight.append(batch)
        return batch

    def _goes_on(self, seq: Sequence) -> bool:
        """Whether one more token (not yet appended) leaves `seq` below max_tokens and max_model_len."""
        limit = seq.params.max_tokens
        return (limit is None or seq.num_output_tokens + 1 < limit) and seq.num_tokens + 1 < self.config.max_model_len

    def discard(self, batch: ScheduledBatch) -> None:
        """Forget the in-flight `batch` whose every sequence has finished meanwhile (its pages are freed)."""
        at = next((i for i, b in enumerate(self._in_flight) if b is batch), None)  # identity: batches compare equal
        if at is None or not all(r.seq.is_finished for r in batch.rows):
            raise ValueError("Scheduler.discard: only an in-flight batch of finished sequences")
        del self._in_flight[at]

    def _num_drafts(self, seq: Sequence, remaining: int, budget: int) -> int:
        """Draft slots for a decode row: no more than the budget, max_model_len or max_tokens can use."""
        k = self.config.num_draft_tokens
        if not k or remaining != 1 or seq.num_computed_tokens == 0:
            return 0
        k = min(k, budget - 1, self.config.max_model_len - seq.num_tokens)
        if seq.params.max_tokens is not None:
            k = min(k, seq.params.max_tokens - seq.num_output_tokens - 1)
        return max(k, 0)

    def postprocess(self, batch: ScheduledBatch, sampled_token_ids: Seq[int | Seq[int] | None]) -> list[Sequence]:
        """Record a computed batch. `sampled_token_ids[i]` is row i's sampled token (ignored, may be
        None, for rows with sample=False), or for a speculative row the list of emitted tokens: its
        accepted drafts, then the target's token. Tokens are appended one at a time and the stop
        conditions checked after each (later tokens are dropped). Returns the sequences that
        finished in this step."""
        if not batch.rows:
            return []
        if not self._in_flight or batch is not self._in_flight[0]:
            raise ValueError("Scheduler.postprocess: batch is not the oldest one scheduled and not postprocessed")
        if len(sampled_token_ids) != len(batch.rows):
            raise ValueError(f"Scheduler.postprocess: {len(sampled_token_ids)} sampled ids for "
                             f"{len(batch.rows)} rows")
        self._in_flight.pop(0)
        finished = []
        for row, token in zip(batch.rows, sampled_token_ids):
            seq = row.seq
            if seq.is_finished:  # aborted after schedule()
                continue
            if not row.sample:
                seq.num_computed_tokens += row.num_tokens
                continue
            tokens = list(token) if isinstance(token, (list, tuple)) else [token]
            if not tokens or any(t is None for t in tokens):
                raise ValueError(f"Scheduler.postprocess: row of request {seq.request_id!r} needs a token")
            accepted = len(tokens) - 1  # the model computed these drafts, so they are in the cache
            if tokens[:-1] != row.draft_token_ids[:accepted] or accepted > len(row.draft_token_ids):
                raise ValueError(f"Scheduler.postprocess: request {seq.request_id!r}: tokens {tokens} do not "
                                 f"start with the row's drafts {row.draft_token_ids}")
            seq.num_computed_tokens += row.num_tokens + accepted
            for t in tokens:
                seq.append_token(t)
                if seq.check_stop(self.eos_token_ids, self.config.max_model_len, self.detokenize):
                    self.running.remove(seq)
                    del self.requests[seq.request_id]
                    if not self.keep_finished:
                        self.block_manager.free(seq)
                    finished.append(seq)
                    break
        return finished

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        _insert(self.waiting, seq)
