"""EngineConfig.retain_finished (dsv4.engine.retention): a finished sequence's cache adopted by a prompt that
continues it, on the tiny fp32 model of test_engine.py (whose results do not depend on chunking or batching).

Reference: the same requests through an engine without retention, which prefills every prompt from its first
token. Greedy tokens must match exactly; the adopting requests must have computed only their new tokens."""
from __future__ import annotations

import random

import pytest

from dsv4.engine.cache import CacheConfig
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams
from test_engine import CFG, MAX_LEN, ckpt, drain, model  # noqa: F401  (fixtures)


def engine_with(model, retain: int, *, overlap: bool = False, cache: CacheConfig | None = None,  # noqa: F811
                budget: int = 64, max_num_seqs: int = 8, share: bool = True) -> LLMEngine:
    ec = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=MAX_LEN,
                      cache=cache, overlap=overlap, retain_finished=retain, share_prompts=share)
    return LLMEngine(model, model.config, None, ec)


def counting_tokens(engine: LLMEngine) -> list[int]:
    """Record the tokens every forward computes (HybridCache.run's rows)."""
    seen, run = [], engine.cache.run

    def counted(model, batch, input_ids=None):
        seen.append(sum(r.num_tokens for r in batch.rows))
        return run(model, batch, input_ids)

    engine.cache.run = counted
    return seen


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


def turns(rng: random.Random, first_len: int, n_turns: int) -> list[tuple[list[int], int]]:
    """A conversation's prompts are built as it runs; here: each turn's (new user tokens, max_tokens)."""
    return [([rng.randrange(2, CFG.vocab_size) for _ in range(first_len if t == 0 else rng.randrange(1, 9))],
             rng.randrange(3, 9)) for t in range(n_turns)]


def converse(engine: LLMEngine, plan, params=greedy) -> list[list[int]]:
    """Run the turns one after the other: turn t's prompt is every earlier prompt, reply and the new tokens."""
    history, outs = [], []
    for t, (new, n) in enumerate(plan):
        prompt = history + new
        engine.add_request(f"t{t}", prompt, params(n))
        out = drain(engine)[f"t{t}"]["tokens"]
        outs.append(out)
        history = prompt + out
    return outs


def fresh_tokens(plan, outs) -> list[int]:
    """Per turn, the tokens an engine without retention computes: its prompt, then one per generated token but
    the last."""
    history, counts = [], []
    for (new, _), out in zip(plan, outs):
        prompt = history + new
        counts.append(len(prompt) + len(out) - 1)
        history = prompt + out
    return counts


@pytest.mark.parametrize("overlap,share", [(False, True), (True, True), (False, False)])
@pytest.mark.parametrize("first_len", [5, 120])  # 120: the conversation crosses the first HCA entry (128)
def test_conversation_reuses_each_turn(model, first_len, overlap, share):  # noqa: F811
    """Each turn adopts the previous turn's sequence (its prompt and reply but the reply's last token, which was
    sampled, never fed) and computes only the rest: the same tokens as without retention. With prompt sharing the
    adopter forks the entry, which stays (the 2 newest are kept); without, it moves (1 is kept). (first_len 5: the
    first turn holds fewer than 16 tokens, too few to fork, and moves either way.)"""
    plan = turns(random.Random(first_len), first_len, 5)
    want = converse(engine_with(model, 0), plan)
    engine = engine_with(model, 2, overlap=overlap, share=share)
    computed = counting_tokens(engine)
    assert converse(engine, plan) == want
    s = engine.stats()
    fresh = fresh_tokens(plan, want)
    assert (s.num_adopted, s.num_retained) == (len(plan) - 1, 2 if share else 1)
    assert s.num_forks == 0  # (forks of retained sequences count as adoptions)
    assert s.adopted_tokens == sum(fresh[:-1])  # turn t reused everything turn t - 1 computed
    assert sum(computed) == sum(fresh) - s.adopted_tokens
    engine.retained.clear()
    assert engine.stats().free_pages == engine.stats().total_pages


def test_a_stop_seen_after_a_look_ahead_step_keeps_the_stop_token(model):  # noqa: F811
    """With the engine's overlap, a sequence that stops on a stop token has had that token fed by the look-ahead
    step already: its retained key includes it, and the next turn reuses one token more than without overlap."""
    rng = random.Random(7)
    prompt = [rng.randrange(2, CFG.vocab_size) for _ in range(30)]
    probe = engine_with(model, 0)
    probe.add_request("p", prompt, greedy(12))
    stop = drain(probe)["p"]["tokens"][5]  # stops at its first occurrence (at most the 6th token)
    reused = {}
    for overlap in (False, True):
        engine = engine_with(model, 4, overlap=overlap)
        engine.add_request("a", prompt, greedy(12, stop_token_ids=[stop]))
        out = drain(engine)["a"]["tokens"]
        assert out[-1] == stop and len(out) <= 6
        follow = prompt + out + [rng.randrange(2, CFG.vocab_size) for _ in range(3)]
        engine.add_request("b", follow, greedy(4))
        got = drain(engine)["b"]["tokens"]
        ref = engine_with(model, 0)
        ref.add_request("b", follow, greedy(4))
        assert got == drain(ref)["b"]["tokens"]
        reused[overlap] = engine.stats().adopted_tokens
    assert reused == {False: 30 + len(out) - 1, True: 30 + len(out)}


def test_retained_pages_give_way_before_anybody_is_preempted(model):  # noqa: F811
    """A tiny page pool: retained sequences are evicted (oldest first) to admit and grow new ones; no preemption
    happens that the same workload without retention would not have; every output as without retention."""
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=4, max_model_len=MAX_LEN, page_sizes=sizes,
                                     num_pages={"compressed4": 24, "indexer4": 24})
    rng = random.Random(9)
    prompts = [[rng.randrange(2, CFG.vocab_size) for _ in range(rng.randrange(20, 90))] for _ in range(10)]
    outs, preemptions = {}, {}
    for retain in (0, 8):
        engine = engine_with(model, retain, cache=cache, max_num_seqs=4)
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, greedy(6))
            if i % 3 == 2:
                outs.setdefault(retain, {}).update({k: v["tokens"] for k, v in drain(engine).items()})
        outs[retain].update({k: v["tokens"] for k, v in drain(engine).items()})
        s = engine.stats()
        preemptions[retain] = s.num_preemptions
        if retain:
            assert 0 < s.num_retained < len(prompts)  # some were kept, the pool forced the others out
            engine.retained.clear()
        assert engine.stats().free_pages == engine.stats().total_pages
    assert outs[0] == outs[8] and preemptions[8] == preemptions[0]


def test_conversations_under_page_pressure(model):  # noqa: F811
    """Four conversations at once, three turns each, in a pool too small for them: adopted caches that do not fit
    go back (`give_back`) and retained ones are evicted; every reply as without retention, nothing leaks."""
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=3, max_model_len=MAX_LEN, page_sizes=sizes,
                                     num_pages={"compressed4": 22, "indexer4": 22})
    rng = random.Random(13)
    plans = [turns(rng, rng.randrange(20, 60), 3) for _ in range(4)]
    results = {}
    for retain in (0, 6):
        engine = engine_with(model, retain, cache=cache, max_num_seqs=3, budget=48)
        history = [[] for _ in plans]
        out = {}
        for t in range(3):
            for c, plan in enumerate(plans):
                history[c] = history[c] + plan[t][0]
                engine.add_request(f"c{c}t{t}", history[c], greedy(plan[t][1]))
            done = drain(engine)
            for c in range(len(plans)):
                out[c, t] = done[f"c{c}t{t}"]["tokens"]
                history[c] = history[c] + out[c, t]
        results[retain] = out
        if retain:
            s = engine.stats()
            assert s.num_adopted >= 1
            engine.retained.clear()
        assert engine.stats().free_pages == engine.stats().total_pages and engine.cache.states == {}
    assert results[6] == results[0]


@pytest.mark.parametrize("kept", [0, 2])
def test_an_adopter_that_does_not_fit_gives_the_cache_back(model, kept):  # noqa: F811
    """B decodes in a pool it nearly fills while A's first turn is retained; A's second turn adopts A's cache at
    admission, does not fit, and gives it back (a waiting request holds no pages), B grows into the pool by evicting
    it, and A's turn then prefills from scratch: the same replies as without retention. kept=0: no window ring is
    spare, so A's turn takes the retained cache itself (a move); kept=2: it forks it, and the fork is undone."""
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=2, max_model_len=MAX_LEN, page_sizes=sizes, kept_states=kept,
                                     num_pages={"compressed4": 18, "indexer4": 18})  # one 288-token sequence
    rng = random.Random(17)
    a1, b, tail = ([rng.randrange(2, CFG.vocab_size) for _ in range(n)] for n in (40, 220, 30))
    replies = {}
    for retain in (0, 2):
        engine = engine_with(model, retain, cache=cache, max_num_seqs=2, budget=256)
        given, undone = [], []
        if retain:
            inner, undo = engine.scheduler.give_back, engine.sharing.undo
            engine.scheduler.give_back = lambda seq: given.append(seq.request_id) or inner(seq)
            engine.sharing.undo = lambda seq: undone.append(undo(seq)) or undone[-1]
        engine.add_request("a1", a1, greedy(6))
        out = {"a1": drain(engine)["a1"]["tokens"]}
        engine.add_request("b", b, greedy(40))
        engine.step()  # b prefilled and running
        engine.add_request("a2", a1 + out["a1"] + tail, greedy(4))
        out.update({k: v["tokens"] for k, v in drain(engine).items()})
        replies[retain] = out
        if retain:
            assert given and given[0] == "a2"
            assert engine.stats().num_adopted == 0  # the adoption given back is not counted
            assert any(undone) == (kept > 0), undone  # a fork taken back, or a move given back
            engine.retained.clear()
        assert engine.stats().free_pages == engine.stats().total_pages and engine.cache.states == {}
    assert replies[2] == replies[0]


def test_what_does_not_adopt(model):  # noqa: F811
    """No adoption for a prompt that diverges from the retained tokens or that asks for prompt logprobs (scored
    from its first token); an aborted adopter frees the pages. (A prompt equal to the retained tokens forks them
    back a token: test_retention_prefix's regenerated reply.)"""
    rng = random.Random(11)
    prompt = [rng.randrange(2, CFG.vocab_size) for _ in range(25)]
    engine = engine_with(model, 4)
    engine.add_request("a", prompt, greedy(5))
    out = drain(engine)["a"]["tokens"]
    held = prompt + out[:-1]
    other = list(held)
    other[10] = (other[10] + 1) % CFG.vocab_size
    engine.add_request("diverges", other + [3], greedy(2))
    engine.add_request("scored", held + [3], greedy(2, prompt_logprobs=0))
    drain(engine)
    assert engine.stats().num_adopted == 0
    engine.add_request("adopts", held + [3, 4], greedy(2))
    assert engine.stats().num_adopted == 0  # at admission, not on arrival: a waiting request holds no pages
    engine.step()
    assert engine.stats().num_adopted == 1 and engine.scheduler.requests["adopts"].num_computed_tokens == len(held) + 2
    engine.abort_request("adopts")
    engine.retained.clear()
    assert engine.stats().free_pages == engine.stats().total_pages and engine.cache.states == {}


def test_config_errors():
    with pytest.raises(ValueError, match="retain_finished=-1"):
        EngineConfig(retain_finished=-1)


@pytest.mark.parametrize("together", [False, True])
def test_a_regenerated_reply_and_a_branch_reuse_the_same_turn(model, together):  # noqa: F811
    """Turn 1, then three continuations of it (a regenerated turn 2 with another seed, a branch with other user
    tokens), one after the other or arriving together: each forks the retained turn 1 and computes only its new
    tokens, with the sampled replies an engine without retention gives."""
    rng = random.Random(23)
    first = [rng.randrange(2, CFG.vocab_size) for _ in range(60)]
    ref = engine_with(model, 0)
    ref.add_request("t1", first, greedy(6))
    reply = drain(ref)["t1"]["tokens"]
    held = first + reply[:-1]  # (the reply's last token was sampled, never fed)
    branches = [(f"b{i}", first + reply + [rng.randrange(2, CFG.vocab_size) for _ in range(k)],
                 SamplingParams(temperature=0.9, seed=i, max_tokens=5, ignore_eos=True))
                for i, k in enumerate((3, 3, 7))]
    results = {}
    for retain in (0, 4):
        engine = engine_with(model, retain)
        computed = counting_tokens(engine)
        engine.add_request("t1", first, greedy(6))
        drain(engine)
        before = sum(computed)
        out = {}
        for rid, prompt, params in branches:
            engine.add_request(rid, prompt, params)
            if not together:
                out.update({k: v["tokens"] for k, v in drain(engine).items()})
        out.update({k: v["tokens"] for k, v in drain(engine).items()})
        results[retain] = out
        if retain:
            s = engine.stats()
            assert (s.num_adopted, s.adopted_tokens) == (3, 3 * len(held))
            new = sum(len(p) - len(held) + len(out[rid]) - 1 for rid, p, _ in branches)
            assert sum(computed) - before == new
            engine.retained.clear()
        assert engine.stats().free_pages == engine.stats().total_pages and engine.cache.states == {}
    assert results[4] == results[0] and results[0]["b0"] != results[0]["b1"]


def test_forked_turns_go_first_least_recently_forked_first(model):  # noqa: F811
    """Capacity 2: an unrelated request finishes (never forked), then a conversation of two turns, the second forking
    the first: the first turn goes (forked), not the older unrelated one; a third request continuing turn 2 forks it,
    and then turn 2 goes. The forks give the same tokens as an engine without retention."""
    rng = random.Random(29)
    other = [rng.randrange(2, CFG.vocab_size) for _ in range(30)]
    plan = turns(rng, 40, 2)
    engine, ref = engine_with(model, 2), engine_with(model, 0)
    for e in (engine, ref):
        e.add_request("other", other, greedy(3))
    other_key = tuple(other + drain(engine)["other"]["tokens"][:-1])
    drain(ref)
    outs = converse(engine, plan)
    assert outs == converse(ref, plan)
    history, keys = [], []  # each turn's retained tokens: its prompt and reply but the reply's last token
    for (new, _), out in zip(plan, outs):
        history = history + new + out
        keys.append(tuple(history[:-1]))
    assert engine.retained.eviction_order() == [other_key, keys[1]]
    follow = history + [5, 6]
    for e in (engine, ref):
        e.add_request("again", follow, greedy(3))
    out = drain(engine)["again"]["tokens"]
    assert out == drain(ref)["again"]["tokens"]
    assert engine.stats().num_adopted == 2
    assert engine.retained.eviction_order() == [other_key, tuple(follow + out[:-1])]
    engine.retained.clear()
    assert engine.stats().free_pages == engine.stats().total_pages
