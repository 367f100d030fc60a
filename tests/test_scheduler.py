"""Scheduler + BlockManager + Sampler driven by a fake paged model (_scheduler_helpers.py).

The fake model stores what a DeepSeek-V4 layer caches (window ring, compressed entries, indexer keys,
compressor partial state) in the pages the scheduler hands out, and derives each next-token
distribution from what it reads back. The reference derives the same distribution straight from the
token list and runs each request alone, so any wrong chunk, position, page or recompute changes the
outputs (or trips an assertion in the fake model). Stop strings and stop rules are in
test_scheduler_stop.py."""
import random
from dataclasses import replace

import pytest
import torch

from _scheduler_helpers import (EOS, LARGE, MAX_LEN, MIN_PAGES, MOD, RATIOS, TINY, VOCAB, WINDOW, Request, fold,
                                logits_from, page_kinds, run_engine)
from dsv4.engine.block_manager import BlockManager
from dsv4.engine.sampler import Sampler, make_generator
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine.scheduler import Scheduler, SchedulerConfig
from dsv4.engine.sequence import Sequence


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


def test_outputs_independent_of_priorities(reference):
    """Random priorities in a tiny pool: the outputs are each request's alone (priority only orders the work);
    run_engine checks at every step that rows, running and waiting sequences and preemption victims follow
    (priority, arrival)."""
    rng = random.Random(5)
    reqs = [Request(r.rid, r.prompt, replace(r.params, priority=rng.randrange(-2, 3))) for r in REQS]
    arrivals = {}
    for i in range(len(reqs)):
        arrivals.setdefault(rng.randrange(20), []).append(i)
    outs, sched, _ = run_engine(reqs, budget=9, max_seqs=4, pages=TINY, arrivals=arrivals)
    assert outs == reference and sched.num_preemptions > 0


def test_lower_priority_values_are_admitted_first():
    """One sequence at a time: A runs; B (priority 5), C (-1) and D (0) arrive in that order while it does: C
    preempts A at once (a lower value), then D (as A's priority, but A is now waiting and arrived first: A goes on
    first), and B last."""
    reqs = [Request(rid, [3, 4, 5, 6], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, priority=p))
            for rid, p in (("A", 0), ("B", 5), ("C", -1), ("D", 0))]
    first_seen: dict[str, int] = {}
    victims = []

    def note(sched, batch):
        victims.extend(v.request_id for v in batch.preempted)
        for r in batch:
            first_seen.setdefault(r.seq.request_id, len(first_seen))

    outs, _, _ = run_engine(reqs, budget=64, max_seqs=1, pages=LARGE, arrivals={0: [0], 1: [1, 2, 3]},
                            in_flight=note)
    assert sorted(first_seen, key=first_seen.get) == ["A", "C", "D", "B"] and victims == ["A"]
    assert outs == reference_outputs(reqs)
    with pytest.raises(ValueError, match="priority"):
        SamplingParams(priority=1.5)


def test_the_lowest_priority_is_preempted_first():
    """A tiny pool, A (priority 1) admitted first, B (priority 0) later: when the pages run out, A goes (the last
    in order), not B, the latest arrival; both still give their outputs alone."""
    rng = random.Random(8)
    a, b = (Request(rid, [rng.randrange(1, VOCAB) for _ in range(30)],
                    SamplingParams(temperature=0.0, ignore_eos=True, priority=p)) for rid, p in (("A", 1), ("B", 0)))
    victims = []
    pages = {**TINY, "window": 2 * MIN_PAGES["window"], "state": 2}  # both run; their entries do not fit
    outs, sched, _ = run_engine([a, b], budget=64, max_seqs=2, pages=pages, arrivals={0: [0], 1: [1]},
                                in_flight=lambda sched, batch: victims.extend(v.request_id for v in batch.preempted))
    assert victims and set(victims) == {a.rid}
    assert outs == reference_outputs([a, b])


def test_a_higher_priority_arrival_takes_the_pages_of_a_lower_one():
    """Room for two sequences but pages for about one: A (priority 1) runs, B (priority 0) arrives and does not fit
    beside it: A is preempted at once for B (its row leaves that step's batch), and goes on after B."""
    rng = random.Random(12)
    a, b = (Request(rid, [rng.randrange(1, VOCAB) for _ in range(n)],
                    SamplingParams(temperature=0.0, ignore_eos=True, priority=p))
            for rid, n, p in (("A", 50, 1), ("B", 40, 0)))
    batches = []  # (the rows' request ids, the preempted ones) of each step

    def note(sched, batch):
        batches.append(([r.seq.request_id for r in batch], [v.request_id for v in batch.preempted]))

    pages = {**TINY, "window": 2 * MIN_PAGES["window"], "state": 2}
    outs, _, _ = run_engine([a, b], budget=128, max_seqs=2, pages=pages, arrivals={0: [0], 2: [1]}, in_flight=note)
    first_b = next(i for i, (rows, _) in enumerate(batches) if "B" in rows)
    assert batches[first_b] == (["B"], ["A"])  # B's first step: A preempted, its row out of the batch
    assert [v for _, vs in batches for v in vs] == ["A"]
    assert outs == reference_outputs([a, b])
