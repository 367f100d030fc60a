"""EngineConfig.share_prompts (dsv4.engine.prompt_sharing): requests with the same prompt compute it once, the
others copy the first one's cache, on the tiny fp32 model of test_engine.py (whose results do not depend on
chunking or batching).

Reference: the same requests through an engine with share_prompts=False, which prefills every prompt itself.
Tokens (greedy and seeded sampling) and logprobs must match exactly; the forks must have computed only what the
stats say they did not share, and every page must come back."""
from __future__ import annotations

import random

import pytest
import torch

from dsv4.engine.block_manager import BlockManager, make_page_kinds
from dsv4.engine.cache import CacheConfig
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.paged_state import PagedPools
from dsv4.engine.prompt_sharing import MIN_SHARED_TOKENS
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine.sequence import Sequence
from test_engine import CFG, MAX_LEN, assert_all_pages_free, ckpt, drain, model  # noqa: F401  (fixtures)
from test_retention import counting_tokens, greedy


def engine_with(model, share: bool, *, overlap: bool = False, cache: CacheConfig | None = None,  # noqa: F811
                budget: int = 256, max_num_seqs: int = 8, kv_dtype: str = "auto") -> LLMEngine:
    ec = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=MAX_LEN,
                      cache=cache, overlap=overlap, share_prompts=share, kv_dtype=kv_dtype)
    return LLMEngine(model, model.config, None, ec)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(2, CFG.vocab_size) for _ in range(n)]


def run_both(model, requests, arrivals=None, wrap=lambda engine: engine, **kw):  # noqa: F811
    """(outputs with sharing, outputs without, the sharing engine, the tokens each engine computed)."""
    results, computed, engines = {}, {}, {}
    for share in (True, False):
        engine = engines[share] = wrap(engine_with(model, share, **kw))
        computed[share] = counting_tokens(engine)
        for rid, prompt, params in requests:
            engine.add_request(rid, prompt, params)
        results[share] = drain(engine, arrivals)
        assert_all_pages_free(engine)
    return results[True], results[False], engines[True], {k: sum(v) for k, v in computed.items()}


def sampled(n: int, seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_k=40, max_tokens=n, seed=seed, ignore_eos=True, logprobs=2)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("length,kv_dtype,budget", [(23, "auto", 256), (130, "fp8", 256), (200, "auto", 48)])
def test_n_choices_compute_the_prompt_once(model, length, kv_dtype, budget, overlap):  # noqa: F811
    """Four requests of one prompt arriving together (greedy and seeded sampling): the first computes the prompt,
    the three others wait for it and copy its cache but the last prompt token. Lengths cross the window ring (20
    slots), a ratio-128 entry (130, with the FP8 / FP4 cache), and a prompt prefilled in five chunks."""
    prompt = tokens(random.Random(length), length)
    requests = [("g0", prompt, greedy(7)), ("g1", prompt, greedy(7)),
                ("s0", prompt, sampled(9, 5)), ("s1", prompt, sampled(9, 6))]
    got, want, engine, computed = run_both(model, requests, overlap=overlap, kv_dtype=kv_dtype, budget=budget)
    for rid in want:
        assert got[rid]["tokens"] == want[rid]["tokens"], rid
        assert [(lp.token_id, lp.logprob) for lp in got[rid]["logprobs"]] == \
            [(lp.token_id, lp.logprob) for lp in want[rid]["logprobs"]], rid
    assert got["g0"]["tokens"] == got["g1"]["tokens"] and got["s0"]["tokens"] != got["s1"]["tokens"]
    s = engine.stats()
    assert (s.num_forks, s.shared_prompt_tokens) == (3, 3 * (length - 1))
    assert computed[True] == computed[False] - s.shared_prompt_tokens


def test_a_prompt_that_extends_a_running_one_forks_it_whole(model):  # noqa: F811
    """B's prompt is A's and 5 tokens more: B waits for A's prompt and takes all of it, computing its 5 tokens;
    C's prompt diverges from A's before its end and is computed whole, at once (it does not wait)."""
    rng = random.Random(3)
    a = tokens(rng, 60)
    c = a[:40] + tokens(rng, 25)
    requests = [("a", a, greedy(5)), ("b", a + tokens(rng, 5), greedy(5)), ("c", c, greedy(5))]
    got, want, engine, computed = run_both(model, requests)
    assert {k: v["tokens"] for k, v in got.items()} == {k: v["tokens"] for k, v in want.items()}
    s = engine.stats()
    assert (s.num_forks, s.shared_prompt_tokens) == (1, 60)
    assert computed[True] == computed[False] - 60


@pytest.mark.parametrize("step,forks", [(2, 1), (4, 1), (6, 0)])
def test_a_late_copy_reaches_back_at_most_max_rollback(model, step, forks):  # noqa: F811
    """B arrives while A decodes: at step 2 (A's state one token past its prompt) and 4 (three) B forks A rolled
    back to its prompt but one token; at step 6 (five past, beyond max_rollback = 4) B computes its prompt."""
    prompt = tokens(random.Random(step), 50)
    arrivals = {step: [("b", prompt, greedy(6))]}
    got, want, engine, computed = run_both(model, [("a", prompt, greedy(12))], arrivals)
    assert got == want
    s = engine.stats()
    assert (s.num_forks, s.shared_prompt_tokens) == (forks, forks * 49)
    assert computed[True] == computed[False] - s.shared_prompt_tokens


def test_what_neither_waits_nor_forks(model):  # noqa: F811
    """A prompt shorter than MIN_SHARED_TOKENS, a request asking for prompt logprobs (scored from its first token),
    and a request whose source is aborted while it waits: each computes its prompt, with the reference's results."""
    rng = random.Random(5)
    short, long = tokens(rng, MIN_SHARED_TOKENS - 1), tokens(rng, 40)
    requests = [("s0", short, greedy(4)), ("s1", short, greedy(4)),
                ("l0", long, greedy(4)), ("l1", long, greedy(4, prompt_logprobs=2, logprobs=1))]
    got, want, engine, _ = run_both(model, requests)
    assert got == want and engine.stats().num_forks == 0

    engine = engine_with(model, True, budget=16)  # the source's prompt takes 3 steps
    engine.add_request("src", long, greedy(4))
    engine.add_request("waits", long, greedy(4))
    engine.step()
    assert engine.scheduler.num_waiting == 1  # held for the source
    engine.abort_request("src")
    out = drain(engine)
    alone = engine_with(model, False)
    alone.add_request("waits", long, greedy(4))
    assert out["waits"]["tokens"] == drain(alone)["waits"]["tokens"] and engine.stats().num_forks == 0
    assert_all_pages_free(engine)


def test_forks_under_page_pressure(model):  # noqa: F811
    """Three prompts, four requests each, in a pool too small for them all even with the forks' full entry pages
    shared (18 pages of 4 ratio-4 entries: one 288-token sequence): forks that do not fit are taken back (nobody
    waits holding pages), sequences are preempted and recomputed; every output as without sharing."""
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=4, max_model_len=MAX_LEN, page_sizes=sizes,
                                     num_pages={"compressed4": 18, "indexer4": 18})
    rng = random.Random(19)
    prompts = [tokens(rng, n) for n in (70, 45, 90)]
    requests = [(f"p{i}n{j}", p, greedy(20 + 5 * j)) for i, p in enumerate(prompts) for j in range(4)]
    got, want, engine, _ = run_both(model, requests, cache=cache, max_num_seqs=4, budget=64)
    assert {k: v["tokens"] for k, v in got.items()} == {k: v["tokens"] for k, v in want.items()}
    s = engine.stats()
    assert s.num_forks >= 3 and s.num_preemptions > 0


def test_a_fork_that_does_not_fit_is_taken_back(model):  # noqa: F811
    """C (150 tokens, 10 ratio-4 pages of 4 entries) and A (64 tokens, 4 pages) run; B's prompt is A's and 80 tokens
    more. B's fork of A's 64 tokens fills the 18-page pool, its 80 tokens do not fit: the fork is taken back at once
    (B waits without pages, nothing was copied), and once C has finished B forks A again, rolled back over A's
    first two decoded tokens."""
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=3, max_model_len=MAX_LEN, page_sizes=sizes,
                                     num_pages={"compressed4": 18, "indexer4": 18})  # one 288-token sequence
    rng = random.Random(23)
    a, c = tokens(rng, 64), tokens(rng, 150)
    requests = [("c", c, greedy(3)), ("a", a, greedy(20)), ("b", a + tokens(rng, 80), greedy(4))]
    undone = []

    def spying(engine):
        inner = engine.sharing.undo if engine.sharing else None
        if inner:
            engine.sharing.undo = lambda seq: undone.append(seq.request_id) or inner(seq)
        return engine

    got, want, engine, computed = run_both(model, requests, cache=cache, max_num_seqs=3, wrap=spying)
    assert {k: v["tokens"] for k, v in got.items()} == {k: v["tokens"] for k, v in want.items()}
    assert undone == ["b", "b"]  # at steps 1 and 2 (C finishes at step 2)
    s = engine.stats()
    assert (s.num_forks, s.shared_prompt_tokens, s.num_preemptions) == (1, 64, 0)
    fresh = sum(len(prompt) + len(got[rid]["tokens"]) - 1 for rid, prompt, _ in requests)
    assert computed[True] == fresh - 64


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_copy_pages_copies_every_pool_and_only_the_destination(kv_dtype):
    check_copy_pages(kv_dtype, torch.float32, "cpu")


def check_copy_pages(kv_dtype: str, dtype: torch.dtype, device: str) -> None:
    """PagedPools.copy_pages on pools filled with random bytes: each destination page of every layer's window,
    entry (FP8 / FP4 parts too) and compressor-row tensor equals its source page; every other page is unchanged.
    (tests/gpu/test_engine_gpu.py runs it on CUDA.)"""
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=3, max_model_len=MAX_LEN, kv_dtype=kv_dtype)
    bm = BlockManager(make_page_kinds(CFG.compress_ratios, CFG.window + cache.max_rollback, cache.page_sizes,
                                      cache.num_pages))
    pools = PagedPools(CFG, bm, dtype=dtype, device=torch.device(device), max_rollback=cache.max_rollback,
                       kv_dtype=kv_dtype)
    g = torch.Generator(device).manual_seed(29)
    tensors = {}  # kind -> [(tensor as bytes, page dim)]
    for pool in pools.window.values():
        tensors.setdefault("window", []).extend((t, 0) for t in pool.tensors())
    for (layer, name), pool in pools.entries.items():
        kind = f"compressed{CFG.layer(layer).compress_ratio}" if name == "main" else "indexer4"
        tensors.setdefault(kind, []).extend((t, 0) for t in pool.tensors())
    tensors["state"] = [(t, 1) for t in pools.rows.values()]
    for ts in tensors.values():
        for t, _ in ts:
            b = t.view(torch.uint8)
            b.copy_(torch.randint(0, 256, b.shape, generator=g, dtype=torch.uint8, device=device))
    src, dst = Sequence("src", [2] * 200, greedy(1)), Sequence("dst", [2] * 150, greedy(1))
    bm.allocate(src, 200)
    bm.allocate(dst, 150)
    before = {kind: [t.clone() for t, _ in ts] for kind, ts in tensors.items()}
    pools.copy_pages(src.block_tables, dst.block_tables)
    for kind, ts in tensors.items():
        s_pages, d_pages = src.block_tables[kind], dst.block_tables[kind]
        assert 0 < len(d_pages) <= len(s_pages)
        for (t, dim), old in zip(ts, before[kind]):
            now, old = t.view(torch.uint8), old.view(torch.uint8)
            for i, d in enumerate(d_pages):
                assert torch.equal(now.select(dim, d), old.select(dim, s_pages[i]))
            rest = torch.tensor([p for p in range(t.shape[dim]) if p not in d_pages], device=device)
            assert torch.equal(now.index_select(dim, rest), old.index_select(dim, rest))


def test_config_error():
    with pytest.raises(ValueError, match="share_prompts='yes'"):
        EngineConfig(share_prompts="yes")


def test_outputs_and_usage_report_the_cached_prompt_tokens(model):  # noqa: F811
    """RequestOutput.cached_tokens: 0 for the request that computed the prompt, L - 1 for its forks; the server's
    usage counts a prompt's cached tokens once, as the fewest any of its n choices had (here 0: computed once)."""
    from dsv4.serve.protocol import usage
    prompt = tokens(random.Random(41), 30)
    engine = engine_with(model, True)
    for j in range(3):
        engine.add_request(f"c{j}", prompt, greedy(3))
    cached = {}
    while engine.has_unfinished():
        for o in engine.step():
            cached.setdefault(o.request_id, set()).add(o.cached_tokens)
    assert cached == {"c0": {0}, "c1": {29}, "c2": {29}}
    assert usage(30, 9, [0, 29, 29], 3)["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage(60, 9, [29, 29, 5, 7], 2)["prompt_tokens_details"] == {"cached_tokens": 29 + 5}
    assert usage(30, 3)["prompt_tokens_details"] == {"cached_tokens": 0}
