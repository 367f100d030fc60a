"""MTP speculative decoding (dsv4.engine.spec_decode) on tiny fp32 models, CPU: greedy equivalence.

Reference, independent of the speculative path: the same engine without speculation (itself checked
against full-forward greedy decoding in test_engine.py); the fp32 model accumulates in float64, so
verification over 1 + k positions must reproduce the one-token-at-a-time results token for token.
Checkpoints without a usable MTP block and the embedded trained model are in test_spec_decode_checkpoints.py,
the sampling side (the acceptance rule, the sampled distribution) in test_spec_decode_sampling.py.

A random MTP head almost never agrees with a random target, which would leave the accept paths
untested; the greedy tests therefore also use a *bigram drafter*: mtp.0 rewired (embedding ->
e_proj -> head) to predict each token's most frequent successor in the baseline outputs, so drafts
are accepted about half the time and every accepted length 0..k occurs.
"""
from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from _spec_decode_helpers import MAX_LEN, assert_all_free, build_model, drain, make_engine, step
from dsv4.checkpoint.writer import random_master_weights, tiny_config
from dsv4.engine.cache import CacheConfig
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams

CFG = tiny_config("fp4", layers="sliding,csa,hca", vocab_size=32)
# ratio-4 edges, ring (20 slots) crossings, and prompts that reach 128 (the first HCA entry) in decode
LENGTHS = [1, 2, 3, 5, 7, 9, 13, 17, 22, 30, 41, 60, 90, 124, 126, 131]
GEN = 10


def bigram_drafter(cfg, masters: dict, successor: dict[int, int]) -> dict:
    """Masters whose mtp.0 predicts successor[token t+1] for token t+2: h_proj and the stream mixes are
    neutralised, the sub-layers damped (they still run on the MTP state), e_proj maps each token's
    normalised embedding onto the head row of its successor."""
    out, d, hc = dict(masters), cfg.hidden_size, cfg.hc_mult
    emb = masters["embed.weight"].double()
    unit = emb / emb.square().mean(-1, keepdim=True).sqrt()
    head = masters["head.weight"].double()
    want = torch.stack([head[successor.get(t, t)] for t in range(cfg.vocab_size)])
    proj = want.T @ torch.linalg.pinv(unit.T)
    out["mtp.0.e_proj.weight"] = (proj / proj.abs().max()).to(torch.bfloat16)
    out["mtp.0.h_proj.weight"] = masters["mtp.0.h_proj.weight"] * 0
    for name in masters:
        if name.startswith("mtp.0.") and name.endswith(("w2.weight", "wo_b.weight")):
            out[name] = masters[name] * 0.05
    for site in ("attn", "ffn"):
        out[f"mtp.0.hc_{site}_fn"] = masters[f"mtp.0.hc_{site}_fn"] * 0
        base = torch.zeros(2 * hc + hc * hc)
        base[2 * hc:] = (torch.eye(hc) * 30).flatten()  # Sinkhorn of this is the identity mix
        out[f"mtp.0.hc_{site}_base"] = base
    for name in ("enorm", "norm"):
        out[f"mtp.0.{name}.weight"] = torch.ones(d, dtype=torch.bfloat16)
    return out


# ---- greedy equivalence ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def masters():
    return random_master_weights(CFG, seed=61)


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(62)
    return [torch.randint(2, CFG.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]


BIAS = {5: 4.0, 9: -100.0}  # request 7's: token 9 banned, token 5 favoured


def request_params(i: int) -> SamplingParams:
    """Mostly plain greedy; a few rows with penalties, a logit bias, a stop token, logprobs, or eos."""
    kw = dict(temperature=0.0, max_tokens=GEN + (i % 3) - 1, ignore_eos=True)
    if i == 3:
        kw["repetition_penalty"] = 1.3
    if i == 6:
        kw.update(presence_penalty=0.7, frequency_penalty=0.4)
    if i in (4, 9):
        kw["logprobs"] = 2
    if i == 9:
        kw["prompt_logprobs"] = 1  # its prefill chunks also score the prompt (extra LM-head rows, nothing else)
    if i == 10:
        kw["ignore_eos"] = False  # its continuation has an EOS (id 1) at the 4th token
    if i == 12:
        kw["stop_token_ids"] = [17, 30]  # hit at the 8th token
    if i == 7:
        kw["logit_bias"] = BIAS
    return SamplingParams(**kw)


@pytest.fixture(scope="module")
def random_model(masters):
    return build_model(CFG, masters)


@pytest.fixture(scope="module")
def baseline(random_model, prompts):
    engine = make_engine(random_model, None)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, request_params(i))
    out = drain(engine)
    assert len({tuple(r["tokens"]) for r in out.values()}) >= 12  # not a degenerate comparison
    assert out["r10"]["finish"] == out["r12"]["finish"] == "stop"
    assert 9 not in out["r7"]["tokens"] and 5 in out["r7"]["tokens"]  # the bias row's bias acted
    return out


@pytest.fixture(scope="module")
def drafter_model(masters, baseline):
    pairs = Counter((a, b) for r in baseline.values() for a, b in zip(r["tokens"], r["tokens"][1:]))
    successor: dict[int, int] = {}
    for (a, b), _ in pairs.most_common():
        successor.setdefault(a, b)
    return build_model(CFG, bigram_drafter(CFG, masters, successor))


def assert_same(out: dict, baseline: dict, ids) -> None:
    for rid in ids:
        got, want = out[rid], baseline[rid]
        assert got["tokens"] == want["tokens"], rid
        assert got["finish"] == want["finish"], rid
        assert len(got["logprobs"]) == len(want["logprobs"])
        for a, b in zip(got["logprobs"], want["logprobs"]):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-5
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


@pytest.mark.parametrize("k,tiny_pool", [(1, False), (2, True), (3, False)])
def test_greedy_batch16_identical(drafter_model, prompts, baseline, k, tiny_pool):
    cache = None
    if tiny_pool:  # compressed4/indexer4 pages for ~1/3 of the batch: preemption + recompute under speculation
        cache = CacheConfig.for_capacity(CFG, max_num_seqs=16, max_model_len=MAX_LEN,
                                         page_sizes={"window": 8, "compressed4": 4, "indexer4": 4,
                                                     "compressed128": 1},
                                         num_pages={"compressed4": 20, "indexer4": 20})
    engine = make_engine(drafter_model, k, cache=cache)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, request_params(i))
    out = drain(engine)
    assert_same(out, baseline, [f"r{i}" for i in range(len(prompts))])
    assert_all_free(engine)
    spec = engine.speculator.stats
    assert len(spec.accepted_histogram) == k + 1 and min(spec.accepted_histogram) > 0  # every path ran
    s = engine.stats()
    assert (s.spec_num_drafts, s.spec_accepted_tokens) == (spec.num_drafts, spec.num_accepted_tokens)
    assert 0.1 < s.spec_acceptance_rate < 0.95
    assert s.spec_mean_accepted_length == pytest.approx(1 + spec.num_accepted_tokens / spec.num_drafts)
    assert s.generation_tokens_total == sum(len(r["tokens"]) for r in baseline.values())
    if tiny_pool:
        assert engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_batch1_identical(drafter_model, prompts, baseline, k):
    engine = make_engine(drafter_model, k, max_num_seqs=1, budget=40)
    for i in (0, 14):  # 1 token; 126 tokens, chunked, decoding across 128
        engine.add_request(f"r{i}", prompts[i], request_params(i))
    assert_same(drain(engine), baseline, ["r0", "r14"])
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert_all_free(engine)


def test_greedy_identical_through_decode_graphs(drafter_model, prompts, baseline):
    """The engine with decode graphs (capture=False runs the graphs' code through their static, padded
    buffers on the CPU): backbone steps and MTP draft rows take the graph buckets, same tokens."""
    model = copy.deepcopy(drafter_model)  # graphs change how the model runs: not the shared fixture
    # what LLMEngine.from_pretrained gives the graphs for make_engine's 16 sequences with 2 drafts each
    rows = EngineConfig(max_num_seqs=16, speculative="mtp", num_draft_tokens=2).decode_step_rows
    assert rows == 16 * 3
    model.enable_cuda_graphs(max_batch=rows, capture=False)
    stats = []
    for m in (drafter_model, model):
        engine = make_engine(m, 2)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, request_params(i))
        assert_same(drain(engine), baseline, [f"r{i}" for i in range(len(prompts))])
        assert_all_free(engine)
        stats.append(engine.speculator.stats)
    assert model._graphs._steps and model._graphs._mtp_steps  # both kinds of bucket ran
    # the outputs cannot tell wrong drafts (verification rejects them): the drafts themselves must match
    assert stats[0].num_accepted_tokens > 0
    assert (stats[1].num_drafts, stats[1].accepted_histogram) == (stats[0].num_drafts, stats[0].accepted_histogram)


def test_verify_steps_take_a_graph_bucket(drafter_model, prompts, baseline):
    """Graphs sized by `EngineConfig.decode_step_rows` hold a verify step (4 sequences x 3 rows = 12 rows,
    bucket 16): sized by max_num_seqs (4) it would run eagerly. Same tokens as without graphs."""
    ec = EngineConfig(max_num_seqs=4, speculative="mtp", num_draft_tokens=2)
    assert ec.decode_step_rows == 12
    model = copy.deepcopy(drafter_model)
    model.enable_cuda_graphs(max_batch=ec.decode_step_rows, capture=False)
    assert model._graphs.max_batch == 16
    steps = []  # (bucket rows, tokens per sequence) of every graphed step
    paged_step = model._graphs.paged_step

    def recording(pools, input_ids, states, lens):
        steps.append((next(s for s in model._graphs.sizes if s >= input_ids.shape[0]), tuple(lens)))
        return paged_step(pools, input_ids, states, lens)

    model._graphs.paged_step = recording
    engine = make_engine(model, 2, max_num_seqs=4)
    for i in range(4):
        engine.add_request(f"r{i}", prompts[i], request_params(i))
    assert_same(drain(engine), baseline, [f"r{i}" for i in range(4)])
    assert engine.speculator.stats.num_drafts > 0
    assert (16, (3, 3, 3, 3)) in steps  # a verify step of 4 sequences x (1 + 2 drafts) in the 16-row bucket


PLAIN = [i for i in range(len(LENGTHS)) if i not in (3, 4, 6, 7, 9, 10, 12)]  # request_params: plain greedy


@pytest.mark.parametrize("k", [1, 3])
def test_drafts_on_the_device_as_on_the_host(drafter_model, prompts, baseline, k, monkeypatch):
    """Batches of plain greedy rows keep their drafts on the device (`ScheduledBatch.draft_ids`) and read the
    verdict back once per step, with the MTP catch-up launched inside `verify`, before that read (the host path:
    after it, from `advance`). Same tokens as without speculation, and the same drafts, row by row and step by
    step, as the host path (max_tokens 9-11 gives rows of one batch different draft counts near the end)."""
    runs, reads, paused, early, verifying = [], [0], [False], [0], [False]
    real_tolist = torch.Tensor.tolist

    def counting(t):
        reads[0] += not paused[0]
        return real_tolist(t)

    forward_mtp = drafter_model.forward_mtp

    def unread(*args):  # the early MTP catch-up inside verify: on the CPU its input checks read the host's
        early[0] += verifying[0] and reads[0] == 0  # tensors, which on a GPU are trusted device tensors
        paused[0] = True
        try:
            return forward_mtp(*args)
        finally:
            paused[0] = False

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    monkeypatch.setattr(drafter_model, "forward_mtp", unread)
    for on_device in (True, False):
        engine = make_engine(drafter_model, k)
        engine.speculator.on_device = on_device
        drafted, verify = [], engine.speculator.verify

        def recording(batch, logits):
            on_gpu = batch.draft_ids is not None
            reads[0], early[0], verifying[0] = 0, 0, True
            out = verify(batch, logits)
            verifying[0] = False
            if any(r.draft_token_ids for r in batch.rows):
                assert on_gpu == on_device
                drafted.append([(r.seq.request_id, r.start, r.draft_token_ids) for r in batch.rows])
                assert reads[0] == 1 or not on_device  # the verdict: targets and drafts in one read
                assert early[0] == on_device  # one MTP forward before that read, on the device path only
            return out

        engine.speculator.verify = recording
        for i in PLAIN:
            engine.add_request(f"r{i}", prompts[i], request_params(i))
        assert_same(drain(engine), baseline, [f"r{i}" for i in PLAIN])
        assert_all_free(engine)
        runs.append((drafted, engine.speculator.stats.accepted_histogram))
    assert runs[0] == runs[1]
    drafted, histogram = runs[0]
    assert len(histogram) == k + 1 and min(histogram) > 0  # every accepted length ran
    if k > 1:
        assert any(len({len(d) for _, _, d in step}) > 1 for step in drafted)  # rows with different draft counts


def test_early_catch_up_with_its_head_after_the_verdict(drafter_model, prompts, baseline, monkeypatch):
    """Past `EARLY_HEAD_MAX_ROWS` seed candidates the early catch-up leaves the LM head for after the verdict, over
    the seeds alone: the same drafts and accepted lengths as with the head over every candidate."""
    from dsv4.engine import mtp_catch_up
    runs = []
    for cap in (mtp_catch_up.EARLY_HEAD_MAX_ROWS, 1):
        monkeypatch.setattr(mtp_catch_up, "EARLY_HEAD_MAX_ROWS", cap)
        engine = make_engine(drafter_model, 2)
        late_heads, seed = [0], engine.speculator._seed_from_early

        def counting(early):
            late_heads[0] += early.logits is None
            return seed(early)

        engine.speculator._seed_from_early = counting
        for i in PLAIN:
            engine.add_request(f"r{i}", prompts[i], request_params(i))
        assert_same(drain(engine), baseline, [f"r{i}" for i in PLAIN])
        assert (late_heads[0] > 0) == (cap == 1)
        runs.append(engine.speculator.stats.accepted_histogram)
    assert runs[0] == runs[1] and sum(runs[0][1:]) > 0


def test_a_biased_row_keeps_the_drafts_on_the_host(drafter_model, prompts, baseline):
    """A greedy row with a logit bias is not plain greedy: its drafts and verdicts are the biased argmaxes (on the
    device they would be the raw logits' argmaxes). Among plain rows it decides like the rows without speculation."""
    engine = make_engine(drafter_model, 2)
    for i in PLAIN + [7]:
        engine.add_request(f"r{i}", prompts[i], request_params(i))
    assert_same(drain(engine), baseline, [f"r{i}" for i in PLAIN + [7]])
    assert_all_free(engine)


@pytest.mark.parametrize("k", [1, 3])
def test_retained_conversation_under_speculation(drafter_model, prompts, k):
    """EngineConfig.retain_finished with MTP drafts: each turn adopts the last turn's cache, rolled back to where its
    MTP state stopped (the finishing step is fed to the MTP only where its drafts were on the device), and continues
    with drafts: the same tokens as without speculation or retention, turn by turn."""
    def converse(engine) -> list[list[int]]:
        history, outs = [], []
        for t, n in enumerate((17, 5, 9)):
            history = history + prompts[13][t * 10: t * 10 + n]
            engine.add_request(f"t{t}", history, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
            outs.append(drain(engine)[f"t{t}"]["tokens"])
            history = history + outs[-1]
        return outs

    want = converse(make_engine(drafter_model, None))
    engine = LLMEngine(drafter_model, drafter_model.config, None,
                       EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_LEN,
                                    speculative="mtp", num_draft_tokens=k, retain_finished=2))
    assert converse(engine) == want
    s = engine.stats()
    assert s.num_adopted == 2 and s.spec_num_drafts > 0 and s.spec_accepted_tokens > 0
    engine.retained.clear()
    assert_all_free(engine)


@pytest.mark.parametrize("share", [True, False])
def test_retained_after_a_stop_inside_accepted_drafts(drafter_model, prompts, share):
    """A stop token among a step's accepted drafts drops the tokens after it, so the finished sequence holds fewer
    tokens than its states (both level: the MTP caught up before the verdict). Retention rolls both back to the
    tokens, and the next turn adopts them (a fork of the entry, or the entry itself without prompt sharing): the
    same tokens as without speculation or retention."""
    history = list(prompts[13][:17])
    emitted = []  # every step's emitted tokens of the request, without a stop
    engine = make_engine(drafter_model, 3)
    verify = engine.speculator.verify

    def recording(batch, logits):
        out = verify(batch, logits)
        emitted.extend(t for t in out[0] if t is not None)
        return out

    engine.speculator.verify = recording
    engine.add_request("probe", history, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    drain(engine)
    seen, stop = set(history), None
    for tokens in emitted:  # a step that accepted drafts after a token not seen before
        if len(tokens) > 2 and tokens[0] not in seen:
            stop = tokens[0]
            break
        seen.update(tokens)
    assert stop is not None

    def converse(engine) -> list[list[int]]:
        prompt, outs = history, []
        for t in range(2):  # the second turn: the first, its reply, a new message
            if t:
                prompt = prompt + outs[-1] + prompts[12][:5]
            params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop])
            engine.add_request(f"t{t}", prompt, params)
            outs.append(drain(engine)[f"t{t}"]["tokens"])
        return outs

    want = converse(make_engine(drafter_model, None))
    assert want[0][-1] == stop
    engine = LLMEngine(drafter_model, drafter_model.config, None,
                       EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_LEN,
                                    speculative="mtp", num_draft_tokens=3, retain_finished=2, share_prompts=share))
    assert converse(engine) == want
    assert engine.stats().num_adopted == 1
    engine.retained.clear()
    assert_all_free(engine)


def test_thinking_turns_retain_their_prompt_but_its_last_token_under_speculation(drafter_model, prompts):
    """SamplingParams.retain_prefix with MTP drafts: the chunk ends one token short of the prompt (both states level
    there), its copy is retained, and the next turn -- the last token replaced, reasoning dropped -- adopts it: the
    same tokens as without speculation or retention. The MTP state's last row of the copy was fed the replaced token,
    so the adopter takes one token less and computes that row again."""
    def converse(engine) -> tuple[list[list[int]], list[int]]:
        history, outs, lengths = list(prompts[13][:30]), [], []
        for t in range(3):
            prompt = history + [3, 4]  # (stand-ins for <｜Assistant｜><think>)
            lengths.append(len(prompt))
            engine.add_request(f"t{t}", prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True,
                                                               retain_prefix=len(prompt) - 1))
            outs.append(drain(engine)[f"t{t}"]["tokens"])
            history = history + [3, 5, *outs[-1][-2:], 6, 7] + prompts[12][t * 4: t * 4 + 4]
        return outs, lengths

    want, _ = converse(make_engine(drafter_model, None))
    engine = LLMEngine(drafter_model, drafter_model.config, None,
                       EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_LEN,
                                    speculative="mtp", num_draft_tokens=2, retain_finished=4))
    got, lengths = converse(engine)
    assert got == want
    s = engine.stats()
    assert s.num_adopted == 2 and s.adopted_tokens == sum(n - 2 for n in lengths[:-1])
    assert s.spec_accepted_tokens > 0
    engine.retained.clear()
    assert_all_free(engine)


@pytest.mark.parametrize("k", [1, 3])
def test_n_choices_under_speculation(drafter_model, prompts, k):
    """EngineConfig.share_prompts with MTP drafts: three requests copy the first one's cache of their common prompt,
    the backbone and the MTP state rolled back to its last token, and go on drafting: the same tokens as without
    speculation or sharing. The fourth arrives after the first two steps (the source's prefill chunks)."""
    want, got = {}, {}
    for engine, out in ((make_engine(drafter_model, None), want), (make_engine(drafter_model, k), got)):
        engine.sharing = None if engine.speculator is None else engine.sharing  # the reference computes each prompt
        for j in range(4):
            if j == 3:
                step(engine, out)
                step(engine, out)
            engine.add_request(f"a{j}", prompts[13], SamplingParams(temperature=0.0, max_tokens=6 + j, ignore_eos=True))
        drain(engine, out)
        assert_all_free(engine)
    assert {r: v["tokens"] for r, v in got.items()} == {r: v["tokens"] for r, v in want.items()}
    s = engine.stats()
    assert s.num_forks == 3 and s.shared_prompt_tokens == 3 * (len(prompts[13]) - 1) and s.spec_accepted_tokens > 0


@pytest.mark.parametrize("k", [1, 3])
def test_prefix_snapshots_under_speculation(drafter_model, prompts, k):
    """EngineConfig.prefix_snapshots with MTP drafts: the snapshot keeps the MTP state level with the backbone at
    the snapshot point (the chunk's MTP rows are fed before it is taken); the copies draft from it: the same tokens
    as without speculation or snapshots, one request after the other."""
    system = prompts[15][:100]
    asks = [system + prompts[j][:8] for j in (9, 10, 11, 12)]
    runs = []
    for engine in (make_engine(drafter_model, None),
                   LLMEngine(drafter_model, drafter_model.config, None,
                             EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_LEN,
                                          speculative="mtp", num_draft_tokens=k, prefix_snapshots=2))):
        out = {}
        for j, prompt in enumerate(asks):
            engine.add_request(f"q{j}", prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
            drain(engine, out)
        runs.append({r: v["tokens"] for r, v in out.items()})
    assert runs[1] == runs[0]
    s = engine.stats()
    assert (s.snapshots_taken, s.num_forks, s.shared_prompt_tokens) == (1, 2, 2 * 64) and s.spec_accepted_tokens > 0
    engine.snapshots.clear()
    assert_all_free(engine)


def test_draft_slots_respect_budget_and_max_model_len(drafter_model, prompts):
    """k=3 but a budget of 3 tokens per step leaves room for 2 drafts; max_model_len cuts the last
    steps shorter still. Output as without speculation, ending exactly at max_model_len."""
    prompt = prompts[9]
    max_len = len(prompt) + 9
    runs = []
    for k in (None, 3):
        engine = make_engine(drafter_model, k, max_num_seqs=1, budget=3, max_len=max_len)
        engine.add_request("r", prompt, SamplingParams(temperature=0.0, ignore_eos=True))
        runs.append(drain(engine)["r"])
        assert_all_free(engine)
    assert runs[1] == runs[0] and runs[0]["finish"] == "length" and len(runs[0]["tokens"]) == 9
    spec = engine.speculator.stats
    assert spec.num_accepted_tokens > 0 and len(spec.accepted_histogram) <= 3
    assert spec.num_draft_tokens <= 2 * spec.num_drafts


def test_random_mtp_head_identical_and_abort_frees(random_model, prompts, baseline):
    engine = make_engine(random_model, 2)
    for i in range(6):
        engine.add_request(f"r{i}", prompts[i], request_params(i))
    engine.add_request("gone", prompts[11], request_params(11))
    out: dict = {}
    while engine.scheduler.requests["gone"].num_output_tokens < 3:
        step(engine, out)
    assert engine.speculator._seeds["gone"].position == engine.scheduler.requests["gone"].num_tokens - 2
    engine.abort_request("gone")
    drain(engine, out)
    assert "gone" not in engine.scheduler.requests
    assert_same(out, baseline, [f"r{i}" for i in range(6)])
    assert_all_free(engine)
    assert engine.speculator.stats.num_draft_tokens > 0
