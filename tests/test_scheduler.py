"""Scheduler + BlockManager + Sampler driven by a fake paged model.

The fake model stores what a DeepSeek-V4 layer caches (window ring, compressed entries, indexer keys,
compressor partial state) in the pages the scheduler hands out, and derives each next-token
distribution from what it reads back. The reference derives the same distribution straight from the
token list and runs each request alone, so any wrong chunk, position, page or recompute changes the
outputs (or trips an assertion in the fake model)."""
import random
from dataclasses import dataclass

import pytest
import torch

from dsv4.engine.block_manager import BlockManager, make_page_kinds
from dsv4.engine.sampler import Sampler, make_generator
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


def reference_logits(tokens: list[int]) -> torch.Tensor:
    """What the model should produce after computing `tokens`, straight from the token list."""
    n = len(tokens)
    entries, partial = {}, {}
    for r in RATIOS:
        blocks = []
        for i in range(n // r):
            acc = 0
            for t in tokens[i * r:(i + 1) * r]:
                acc = fold(acc, t)
            blocks.append(acc)
        entries[f"compressed{r}"] = blocks
        if r == 4:
            entries["indexer4"] = [(7 * b) % MOD for b in blocks]
        acc = 0
        for t in tokens[(n // r) * r:]:
            acc = fold(acc, t)
        partial[r] = acc
    return logits_from(tokens[max(0, n - WINDOW):], entries, partial, n)


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


def make_requests(seed: int, n: int, penalties: bool = True) -> list[Request]:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        kind = rng.choice(["greedy", "seeded", "penalised"] if penalties else ["greedy", "seeded"])
        max_tokens = rng.choice([None, 1, 3, 12, 30])
        if kind == "greedy":
            p = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=rng.random() < 0.5)
        else:
            p = SamplingParams(temperature=rng.choice([0.7, 1.0]), top_p=0.9, seed=rng.randrange(10**6),
                               max_tokens=max_tokens,
                               stop_token_ids=[rng.randrange(1, VOCAB)] if rng.random() < 0.3 else [],
                               ignore_eos=rng.random() < 0.3,
                               repetition_penalty=1.3 if kind == "penalised" else 1.0,
                               frequency_penalty=0.4 if kind == "penalised" else 0.0)
        prompt = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 40))]
        reqs.append(Request(f"req{i}", prompt, p))
    return reqs


def reference_outputs(reqs: list[Request]) -> dict[str, tuple[list[int], str]]:
    """Each request alone, unpaged, one token at a time, with independently coded stop rules."""
    sampler = Sampler()
    out = {}
    for r in reqs:
        tokens, gen = list(r.prompt), make_generator(r.params.seed) if r.params.seed is not None else None
        while True:
            t = sampler(reference_logits(tokens)[None], [r.params], [r.prompt],
                        [tokens[len(r.prompt):]], [gen]).token_ids[0]
            tokens.append(t)
            n_out = len(tokens) - len(r.prompt)
            if (t == EOS and not r.params.ignore_eos) or t in r.params.stop_token_ids:
                reason = "stop"
            elif (r.params.max_tokens is not None and n_out == r.params.max_tokens) or len(tokens) == MAX_LEN:
                reason = "length"
            else:
                continue
            out[r.rid] = (tokens[len(r.prompt):], reason)
            break
    return out


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
        assert [r.seq.arrival for r in batch] == sorted(r.seq.arrival for r in batch)
        for row in batch:
            assert row.seq.status == SequenceStatus.RUNNING and row.start == row.seq.num_computed_tokens
            assert row.sample == (row.start + row.num_tokens == row.seq.num_tokens)
            assert row.is_decode == (row.num_tokens == 1 and row.start > 0 and row.sample)
        if batch.preempted:  # victims are the latest arrivals, and nobody is admitted in the same step
            assert min(v.arrival for v in batch.preempted) > max((r.seq.arrival for r in batch), default=-1)
            assert all(v.status == SequenceStatus.WAITING and v.block_tables == {} for v in batch.preempted)
            assert all(any(r.seq is s for s in running_before) for r in batch)
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


REQS = make_requests(11, 20)


@pytest.fixture(scope="module")
def reference():
    ref = reference_outputs(REQS)
    reasons = {reason for _, reason in ref.values()}
    assert reasons == {"stop", "length"}  # the workload exercises both
    return ref


@pytest.mark.parametrize("budget,max_seqs,pages", [(512, 16, LARGE), (7, 16, LARGE), (1, 3, LARGE),
                                                   (13, 4, LARGE), (64, 16, TINY), (16, 8, TINY),
                                                   (5, 2, TINY)])
def test_outputs_independent_of_budget_batch_and_pool(reference, budget, max_seqs, pages):
    outs, sched, _ = run_engine(REQS, budget=budget, max_seqs=max_seqs, pages=pages)
    assert outs == reference
    if pages is TINY:
        assert sched.num_preemptions > 0  # the tiny pool really forced recomputation


@pytest.mark.parametrize("order_seed", [0, 1])
def test_outputs_independent_of_arrival_times(reference, order_seed):
    rng = random.Random(order_seed)
    order = list(range(len(REQS)))
    rng.shuffle(order)
    arrivals = {}
    for i in order:
        arrivals.setdefault(rng.randrange(40), []).append(i)
    outs, _, _ = run_engine(REQS, budget=9, max_seqs=5, pages=TINY, arrivals=arrivals)
    assert outs == reference


def test_ample_budget_runs_everything_concurrently(reference):
    _, _, steps = run_engine(REQS, budget=512, max_seqs=len(REQS), pages=LARGE)
    # Step k samples output token k of every request: steps = the longest output.
    assert steps == max(len(tokens) for tokens, _ in reference.values())


def test_abort_frees_pages_and_leaves_others_intact(reference):
    aborted: dict[str, str] = {}  # what the request was doing -> request id

    def abort_some(sched, batch):
        def kill(what, seq):
            if what not in aborted and not seq.is_finished:
                aborted[what] = seq.request_id
                assert sched.abort(seq.request_id) is seq and seq.finish_reason == "abort"
        for row in batch:
            if not row.sample:
                kill("mid-prefill", row.seq)
            elif row.is_decode and row.seq.num_output_tokens >= 3:
                kill("decoding", row.seq)
        for seq in list(sched.waiting):
            kill("preempted" if seq.num_preemptions else "waiting", seq)

    outs, sched, _ = run_engine(REQS, budget=6, max_seqs=4, pages=TINY, in_flight=abort_some)
    assert set(aborted) == {"mid-prefill", "decoding", "preempted", "waiting"}
    for rid, (tokens, reason) in outs.items():
        if rid in aborted.values():
            assert reason == "abort" and tokens == reference[rid][0][: len(tokens)]
        else:
            assert (tokens, reason) == reference[rid]
    assert sched.abort(aborted["waiting"]) is None and sched.abort("nope") is None


# penalties read the output history on the host, so the engine never looks ahead over them: a workload without
REQS_AHEAD = make_requests(12, 20, penalties=False)


@pytest.fixture(scope="module")
def reference_ahead():
    ref = reference_outputs(REQS_AHEAD)
    assert {reason for _, reason in ref.values()} == {"stop", "length"}
    return ref


@pytest.mark.parametrize("budget,max_seqs,pages", [(512, 16, LARGE), (13, 4, LARGE), (64, 16, TINY), (5, 2, TINY)])
def test_look_ahead_outputs_independent_of_budget_batch_and_pool(reference, reference_ahead, budget, max_seqs,
                                                                  pages):
    """The engine's overlap: sampled rows continued before their batch is postprocessed (two batches in flight,
    rows of sequences that stop on the token computed for nothing) give the reference outputs, pages all freed."""
    outs, sched, _ = run_engine(REQS_AHEAD, budget=budget, max_seqs=max_seqs, pages=pages, look_ahead=True)
    assert outs == reference_ahead
    if pages is LARGE:  # in tiny pools somebody is always waiting or the pages do not fit: no look-ahead
        assert sched.look_aheads > 0
    outs, _, _ = run_engine(REQS, budget=budget, max_seqs=max_seqs, pages=pages, look_ahead=True)
    assert outs == reference  # penalised requests in the mix: fewer look-aheads, the same outputs


def test_look_ahead_with_arrivals_and_aborts(reference_ahead):
    reference, reqs = reference_ahead, REQS_AHEAD
    rng = random.Random(5)
    arrivals: dict[int, list[int]] = {}
    for i in range(len(reqs)):
        arrivals.setdefault(rng.randrange(30), []).append(i)
    outs, sched, _ = run_engine(reqs, budget=9, max_seqs=5, pages=TINY, arrivals=arrivals, look_ahead=True)
    assert outs == reference and sched.look_aheads > 0
    aborted: list[str] = []

    def abort_decoding(sched, batch):  # a request in the middle of its output, whatever batch it is in
        for row in batch:
            if not aborted and not row.seq.is_finished and row.seq.num_output_tokens >= 4:
                aborted.append(row.seq.request_id)
                sched.abort(row.seq.request_id)
    outs, sched, _ = run_engine(reqs, budget=512, max_seqs=len(reqs), pages=LARGE, in_flight=abort_decoding,
                                look_ahead=True)
    assert len(aborted) == 1 and sched.look_aheads > 0
    for rid, (tokens, reason) in outs.items():
        if rid in aborted:
            assert reason == "abort" and tokens == reference[rid][0][: len(tokens)]
        else:
            assert (tokens, reason) == reference[rid]


def test_continuation_rules():
    """schedule_continuation: only with the one batch in flight and nobody waiting, only sampled rows, all pages
    or none; postprocess in order; discard only a batch of finished sequences."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=MAX_LEN),
                      BlockManager(page_kinds(LARGE)), eos_token_ids=[EOS])
    for rid, n in (("a", 2), ("b", 20)):
        sched.add(Sequence(rid, [3] * n, SamplingParams(temperature=0, ignore_eos=True)))
    first = sched.schedule()  # a: whole prompt (sampled); b: a chunk of 14 (not sampled)
    assert [r.sample for r in first] == [True, False]
    with pytest.raises(ValueError, match="only sampled rows"):
        sched.schedule_continuation(first.rows)
    sched.add(Sequence("w", [4], SamplingParams(temperature=0)))
    assert sched.schedule_continuation(first.rows[:1]) is None  # somebody waits
    sched.abort("w")
    nxt = sched.schedule_continuation(first.rows[:1])
    assert [(r.seq.request_id, r.start, r.num_tokens, r.sample) for r in nxt] == [("a", 2, 1, True)]
    assert sched.schedule_continuation(first.rows[:1]) is None  # two batches in flight already
    with pytest.raises(ValueError, match="oldest"):
        sched.postprocess(nxt, [5])
    with pytest.raises(ValueError, match="finished"):
        sched.discard(nxt)
    sched.postprocess(first, [5, None])
    sched.postprocess(nxt, [6])
    assert sched.requests["a"].output_token_ids == [5, 6] and sched.requests["a"].num_computed_tokens == 3
    # pages: a continuation that does not fit allocates nothing (3 tokens fill a window page; the 4th needs one)
    sched = Scheduler(sched.config, BlockManager(page_kinds(LARGE)), eos_token_ids=[EOS])
    sched.add(Sequence("c", [3] * 3, SamplingParams(temperature=0)))
    batch = sched.schedule()
    bm = sched.block_manager
    hog = bm.pools["window"].allocate(bm.num_free("window"))
    before = {k: bm.num_free(k) for k in bm.kinds}
    assert sched.schedule_continuation(batch.rows) is None
    assert {k: bm.num_free(k) for k in bm.kinds} == before and len(sched.requests["c"].block_tables["window"]) == 1
    bm.pools["window"].free(hog)
    assert sched.schedule_continuation(batch.rows) is not None
    assert len(sched.requests["c"].block_tables["window"]) == 2


def test_max_model_len_and_input_errors():
    kinds = page_kinds(LARGE)
    cfg = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=MAX_LEN)
    sched = Scheduler(cfg, BlockManager(kinds), eos_token_ids=[EOS])
    with pytest.raises(ValueError, match="at most 63"):
        sched.add(Sequence("long", [1] * MAX_LEN))
    sched.add(Sequence("a", [1, 2]))
    with pytest.raises(ValueError, match="already active"):
        sched.add(Sequence("a", [3]))
    with pytest.raises(ValueError, match="detokenize"):
        sched.add(Sequence("s", [3], SamplingParams(stop=["x"])))
    batch = sched.schedule()
    with pytest.raises(RuntimeError, match="postprocess"):
        sched.schedule()
    with pytest.raises(ValueError, match="0 sampled ids for 1 rows"):
        sched.postprocess(batch, [])
    with pytest.raises(ValueError, match="max_model_len"):
        Scheduler(cfg, BlockManager(page_kinds(MIN_PAGES | {"compressed4": 7})))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        Sequence("e", [])


def test_prompt_at_limit_generates_one_token():
    p = SamplingParams(temperature=0, ignore_eos=True)
    req = Request("edge", [5] * (MAX_LEN - 1), p)
    outs, _, _ = run_engine([req], budget=16, max_seqs=2, pages=MIN_PAGES)
    tokens, reason = outs["edge"]
    assert reason == "length" and len(tokens) == 1
    assert tokens[0] == int(reference_logits(req.prompt).argmax())


# ---- stop strings -----------------------------------------------------------------------------

PIECES = ["he", "llo", " wor", "ld", "<", "/", "s", ">", "</s>", "x", "yz", "!", "\n"]


def detok(ids: list[int]) -> str:
    return "".join(PIECES[i % len(PIECES)] for i in ids)


def test_stop_string_across_tokens_is_cut_from_text():
    seq = Sequence("s", [9], SamplingParams(stop=["lo w", "zz"]))
    for t in [0, 1]:
        seq.append_token(t)
        assert not seq.check_stop([EOS + 100], MAX_LEN, detok)
    seq.append_token(2)
    assert seq.check_stop([EOS + 100], MAX_LEN, detok)
    assert seq.finish_reason == "stop" and seq.stop_reason == "lo w"
    assert seq.output_text == "hel" and seq.output_token_ids == [0, 1, 2]


def test_stop_strings_against_brute_force():
    rng = random.Random(3)
    stops_pool = ["</s>", "s>", "yz!", "\n\n", "ld<", "o w"]
    for trial in range(200):
        stops = rng.sample(stops_pool, rng.randrange(1, 3))
        stream = [rng.randrange(len(PIECES)) for _ in range(25)]
        seq = Sequence("s", [1], SamplingParams(stop=stops, max_tokens=20))
        for i, t in enumerate(stream):
            seq.append_token(t)
            if seq.check_stop([], None, detok):
                break
        # Brute force: the first prefix whose text contains a stop string; cut at its earliest match.
        want_len, want_text, want_reason = None, None, "length"
        for k in range(1, 21):
            text = detok(stream[:k])
            found = [text.index(s) for s in stops if s in text]
            if found:
                want_len, want_text, want_reason = k, text[: min(found)], "stop"
                break
        if want_reason == "length":
            want_len, want_text = 20, detok(stream[:20])
        assert seq.num_output_tokens == want_len and seq.finish_reason == want_reason
        assert seq.output_text == want_text
        assert not any(s in seq.output_text for s in stops)


def test_stop_tokens_eos_and_length_order():
    seq = Sequence("a", [4], SamplingParams(stop_token_ids=[7], max_tokens=1))
    seq.append_token(7)
    assert seq.check_stop([EOS]) and seq.finish_reason == "stop" and seq.stop_reason == 7
    seq = Sequence("b", [4], SamplingParams(ignore_eos=True, max_tokens=2))
    seq.append_token(EOS)
    assert not seq.check_stop([EOS])
    seq.append_token(EOS)
    assert seq.check_stop([EOS]) and seq.finish_reason == "length"
    seq = Sequence("c", [4, 4], SamplingParams())
    seq.append_token(3)
    assert seq.check_stop([EOS], max_model_len=3) and seq.finish_reason == "length"


def test_stop_strings_end_to_end():
    reqs = [Request(f"r{i}", [1 + i, 2, 3], SamplingParams(temperature=1.0, seed=i, stop=["s>", "ld"],
                                                          max_tokens=40, ignore_eos=True)) for i in range(6)]
    outs_a, _, _ = run_engine(reqs, budget=4, max_seqs=3, pages=TINY, detokenize=detok)
    outs_b, _, _ = run_engine(reqs, budget=64, max_seqs=8, pages=LARGE, detokenize=detok)
    assert outs_a == outs_b
    stopped = [rid for rid, (_, reason) in outs_a.items() if reason == "stop"]
    assert stopped
    for rid in stopped:
        text = detok(outs_a[rid][0])
        assert ("s>" in text or "ld" in text) and not any(s in detok(outs_a[rid][0][:-1]) for s in ("s>", "ld"))
