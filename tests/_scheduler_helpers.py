"""The fake paged model and engine driver of the scheduler tests (test_scheduler.py,
test_scheduler_stop.py).

The fake model stores what a DeepSeek-V4 layer caches (window ring, compressed entries, indexer keys,
compressor partial state) in the pages the scheduler hands out, and derives each next-token
distribution from what it reads back (`logits_from`). `run_engine` drives Scheduler + BlockManager +
Sampler over it as the engine does, checking the scheduler's invariants at every step."""
from dataclasses import dataclass

import torch

from dsv4.engine.block_manager import BlockManager, make_page_kinds
from dsv4.engine.sampler import Sampler
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine.scheduler import Scheduler, SchedulerConfig
from dsv4.engine.sequence import Sequence, SequenceStatus

VOCAB, EOS, WINDOW, RATIOS = 32, 0, 8, (4, 16)
MAX_LEN = 64
MOD = (1 << 61) - 1
PAGE_SIZES = {"window": 3, "compressed4": 2, "indexer4": 5, "compressed16": 1}


def fold(h: int, x: int) -> int:
    return (h * 1_000_003 + x + 1) % MOD


def logits_from(window: list[int], entries: dict[str, list[int]], partial: dict[int, int], n: int) -> torch.Tensor:
    h = fold(0, n)
    for x in window:
        h = fold(h, x)
    for name in sorted(entries):
        for x in entries[name]:
            h = fold(h, x)
    for r in sorted(partial):
        h = fold(h, partial[r])
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(h)) * 2.5


class FakePagedModel:
    def __init__(self, kinds):
        self.kinds = {k.name: k for k in kinds}
        self.pools = {k.name: [[None] * k.page_size for _ in range(k.num_pages)] for k in kinds}
        self.seen: dict[str, int] = {}  # request id -> tokens this model has computed for it

    def write(self, kind: str, seq, index: int, value) -> None:
        page, off = self.kinds[kind].locate(seq.block_tables[kind], index)
        self.pools[kind][page][off] = (seq.request_id, index, value)

    def read(self, kind: str, seq, index: int):
        page, off = self.kinds[kind].locate(seq.block_tables[kind], index)
        rid, idx, value = self.pools[kind][page][off]
        assert (rid, idx) == (seq.request_id, index), f"{kind} slot of {seq.request_id}@{index} holds {rid}@{idx}"
        return value

    def __call__(self, batch, ids: list[int] | None = None) -> torch.Tensor:
        """`ids`: a look-ahead batch's tokens, one per row, not yet appended to the sequences."""
        rows = []
        for i, row in enumerate(batch):
            seq = row.seq
            assert row.start == self.seen.get(seq.request_id, 0) or row.start == 0  # 0: recompute after preemption
            assert row.start + row.num_tokens <= seq.num_tokens + (ids is not None)
            for pos in range(row.start, row.start + row.num_tokens):
                tok = ids[i] if ids is not None else seq.token_ids[pos]
                self.write("window", seq, pos, tok)
                state = {r: 0 for r in RATIOS} if pos == 0 else dict(self.read("state", seq, 0))
                for r in RATIOS:
                    state[r] = fold(state[r], tok)
                    if (pos + 1) % r == 0:
                        self.write(f"compressed{r}", seq, pos // r, state[r])
                        if r == 4:
                            self.write("indexer4", seq, pos // r, (7 * state[r]) % MOD)
                        state[r] = 0
                self.write("state", seq, 0, state)
            n = row.start + row.num_tokens
            self.seen[seq.request_id] = n
            if not row.sample:
                rows.append(torch.full((VOCAB,), float("nan")))  # must never be sampled
                continue
            window = [self.read("window", seq, p) for p in range(max(0, n - WINDOW), n)]
            entries = {}
            for r in RATIOS:
                entries[f"compressed{r}"] = [self.read(f"compressed{r}", seq, i) for i in range(n // r)]
                if r == 4:
                    entries["indexer4"] = [self.read("indexer4", seq, i) for i in range(n // r)]
            rows.append(logits_from(window, entries, self.read("state", seq, 0), n))
        return torch.stack(rows)


@dataclass
class Request:
    rid: str
    prompt: list[int]
    params: SamplingParams


def order(seq) -> tuple[int, int]:
    """The scheduler's order, written out: lower priority values first, then arrival."""
    return seq.params.priority, seq.arrival


def page_kinds(num_pages: dict[str, int]):
    return make_page_kinds([0, *RATIOS, 0], WINDOW, PAGE_SIZES, num_pages)


# One sequence of MAX_LEN tokens needs exactly these pages; "tiny" pools barely exceed them.
MIN_PAGES = {"window": 3, "compressed4": 8, "indexer4": 4, "compressed16": 4, "state": 1}
TINY = {k: v + 1 for k, v in MIN_PAGES.items()}
LARGE = {k: 40 * v for k, v in MIN_PAGES.items()}


def continuing(sched, batch, tokens) -> tuple | None:
    """The engine's look-ahead (`LLMEngine._look_ahead`) on the fake model: when every row samples without
    penalties, the rows that go on whatever their token is continue by one token, computed before the batch is
    postprocessed. (continuation batch, the tokens its rows are fed) or None."""
    if not all(r.sample and not r.seq.params.has_penalties for r in batch):
        return None
    nxt = sched.schedule_continuation(batch.rows)
    at = {id(r.seq): i for i, r in enumerate(batch.rows)}
    return None if nxt is None else (nxt, [tokens[at[id(r.seq)]] for r in nxt.rows])


def run_engine(reqs, *, budget, max_seqs, pages, arrivals=None, in_flight=None, detokenize=None, look_ahead=False):
    """arrivals: step -> request indices added before that step's schedule (default: all at step 0).
    in_flight(sched, batch): called after the model ran and before postprocess (to abort requests).
    look_ahead: continue sampled rows by one token before postprocessing them, as the engine's overlap does."""
    kinds = page_kinds(pages)
    bm = BlockManager(kinds)
    cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=MAX_LEN)
    sched = Scheduler(cfg, bm, eos_token_ids=EOS, detokenize=detokenize)
    model, sampler = FakePagedModel(kinds), Sampler()
    arrivals = dict(arrivals or {0: list(range(len(reqs)))})
    seqs, step, steps_with_work = {}, 0, 0
    pending, sched.look_aheads = None, 0  # (continuation batch, its logits) computed last step
    while arrivals or not sched.is_finished():
        for i in arrivals.pop(step, []):
            seqs[reqs[i].rid] = Sequence(reqs[i].rid, reqs[i].prompt, reqs[i].params)
            sched.add(seqs[reqs[i].rid])
        if pending is not None and all(r.seq.is_finished for r in pending[0]):
            sched.discard(pending[0])
            pending = None
        if pending is not None:
            (batch, logits), pending = pending, None
            steps_with_work += 1
            sample_rows = list(range(len(batch)))
            tokens = sampler.sample_sequences(logits, batch.seqs).token_ids
            if in_flight is not None:
                in_flight(sched, batch)
            nxt = continuing(sched, batch, tokens)
            if nxt is not None:
                pending = (nxt[0], model(nxt[0], nxt[1]))
                sched.look_aheads += 1
            for seq in sched.postprocess(batch, tokens):
                assert seq.is_finished and seq.block_tables == {}
            step += 1
            continue
        running_before = list(sched.running)
        batch = sched.schedule()
        assert len(batch) <= max_seqs and sched.num_running <= max_seqs
        assert batch.num_tokens <= budget
        # rows in (priority, arrival) order: the running ones, then the ones admitted in this step
        old = [order(r.seq) for r in batch if any(r.seq is s for s in running_before)]
        new = [order(r.seq) for r in batch if not any(r.seq is s for s in running_before)]
        assert old == sorted(old) and new == sorted(new) and old + new == [order(r.seq) for r in batch]
        assert [order(s) for s in sched.running] == sorted(order(s) for s in sched.running)
        assert [order(s) for s in sched.waiting] == sorted(order(s) for s in sched.waiting)
        for row in batch:
            assert row.seq.status == SequenceStatus.RUNNING and row.start == row.seq.num_computed_tokens
            assert row.sample == (row.start + row.num_tokens == row.seq.num_tokens)
            assert row.is_decode == (row.num_tokens == 1 and row.start > 0 and row.sample)
        if batch.preempted:  # victims are the last in order; only those they made way for are admitted with them
            assert min(order(v) for v in batch.preempted) > max((order(r.seq) for r in batch), default=(-2**31, -1))
            assert all(v.status == SequenceStatus.WAITING and v.block_tables == {} for v in batch.preempted)
            admitted = [r.seq for r in batch if not any(r.seq is s for s in running_before)]
            # (so with equal priorities nobody is admitted in a step that preempts)
            assert all(v.params.priority > a.params.priority for v in batch.preempted for a in admitted)
        if len(batch):
            steps_with_work += 1
            logits = model(batch)
        if in_flight is not None:
            in_flight(sched, batch)
        if len(batch):
            sample_rows = [i for i, r in enumerate(batch.rows) if r.sample]
            tokens = [None] * len(batch)
            if sample_rows:
                res = sampler.sample_sequences(logits[sample_rows], [batch.rows[i].seq for i in sample_rows])
                for i, t in zip(sample_rows, res.token_ids):
                    tokens[i] = t
            nxt = continuing(sched, batch, tokens) if look_ahead else None
            if nxt is not None:
                pending = (nxt[0], model(nxt[0], nxt[1]))
                sched.look_aheads += 1
            for seq in sched.postprocess(batch, tokens):
                assert seq.is_finished and seq.block_tables == {}
        elif not arrivals:
            assert sched.is_finished(), "scheduler made no progress"
        step += 1
        assert step < 20000
    if pending is not None:  # everything finished while a look-ahead was in flight
        sched.discard(pending[0])
    for k in kinds:
        assert bm.num_free(k.name) == k.num_pages, f"{k.name} pages leaked"
    assert all(u == 0 for u in sched.stats().usage.values())
    return {rid: (s.output_token_ids, s.finish_reason) for rid, s in seqs.items()}, sched, steps_with_work
