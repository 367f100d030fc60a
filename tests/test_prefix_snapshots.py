"""EngineConfig.prefix_snapshots (dsv4.engine.prefix_snapshots): a prompt prefix that several requests share (a
system prompt) is snapshotted by the second request with it and copied by the later ones, on the tiny fp32 model of
test_engine.py (whose results do not depend on chunking or batching).

Reference: the same requests through an engine without snapshots or prompt sharing, which prefills every prompt
itself. Greedy tokens must match exactly; the engine must have computed exactly the tokens the snapshots did not
cover, and every page must come back once the snapshots are cleared."""
from __future__ import annotations

import random

import pytest

from dsv4.engine.cache import CacheConfig
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.prefix_snapshots import SNAPSHOT_BLOCK
from dsv4.engine.sequence import Sequence
from test_engine import CFG, MAX_LEN, assert_all_pages_free, ckpt, drain, model  # noqa: F401  (fixtures)
from test_prompt_sharing import tokens
from test_retention import counting_tokens, greedy


def engine_with(model, snapshots: int, *, overlap: bool = False, cache: CacheConfig | None = None,  # noqa: F811
                budget: int = 256, max_num_seqs: int = 8, kv_dtype: str = "auto") -> LLMEngine:
    ec = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=MAX_LEN, cache=cache,
                      overlap=overlap, share_prompts=bool(snapshots), prefix_snapshots=snapshots, kv_dtype=kv_dtype)
    return LLMEngine(model, model.config, None, ec)


def run(engine: LLMEngine, waves) -> dict:
    """Each wave's requests added together and drained before the next wave."""
    out = {}
    for wave in waves:
        for rid, prompt, n in wave:
            engine.add_request(rid, prompt, greedy(n))
        out.update({k: v["tokens"] for k, v in drain(engine).items()})
    return out


def fresh_count(waves, out) -> int:
    """Tokens an engine that shares nothing computes: each prompt, then one per generated token but the last."""
    return sum(len(prompt) + len(out[rid]) - 1 for wave in waves for rid, prompt, _ in wave)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("system_len,kv_dtype", [(100, "auto"), (240, "fp8")])
def test_a_shared_system_prompt_is_computed_twice_then_copied(model, system_len, kv_dtype, overlap):  # noqa: F811
    """Five requests, one after the other, each a system prompt and a question of its own: the first computes its
    prompt, the second stops a chunk at the system prompt's last whole block and keeps a snapshot there, the other
    three copy it. 240 tokens: the snapshot (192) holds a ratio-128 entry, the window ring wrapped, FP8 / FP4 pools."""
    rng = random.Random(system_len)
    system = tokens(rng, system_len)
    waves = [[(f"q{i}", system + tokens(rng, rng.randrange(5, 30)), rng.randrange(3, 9))] for i in range(5)]
    want = run(engine_with(model, 0), waves)
    engine = engine_with(model, 4, overlap=overlap, kv_dtype=kv_dtype)
    computed = counting_tokens(engine)
    assert run(engine, waves) == want
    at = system_len // SNAPSHOT_BLOCK * SNAPSHOT_BLOCK
    s = engine.stats()
    assert (s.snapshots_taken, s.num_snapshots, s.num_forks, s.shared_prompt_tokens) == (1, 1, 3, 3 * at)
    assert sum(computed) == fresh_count(waves, want) - 3 * at
    engine.snapshots.clear()
    assert_all_pages_free(engine)


def test_a_batch_with_one_system_prompt_computes_it_twice(model):  # noqa: F811
    """Six requests with one system prompt (150 tokens) arriving together: the first computes its prompt, the second
    ends a chunk at 128 and keeps a snapshot, the other four wait for it and copy it."""
    rng = random.Random(43)
    system = tokens(rng, 150)
    waves = [[(f"b{i}", system + tokens(rng, rng.randrange(4, 20)), rng.randrange(3, 9)) for i in range(6)]]
    want = run(engine_with(model, 0), waves)
    engine = engine_with(model, 2)
    computed = counting_tokens(engine)
    assert run(engine, waves) == want
    s = engine.stats()
    assert (s.snapshots_taken, s.num_forks, s.shared_prompt_tokens) == (1, 4, 4 * 128)
    assert sum(computed) == fresh_count(waves, want) - 4 * 128
    engine.snapshots.clear()
    assert_all_pages_free(engine)


@pytest.mark.parametrize("pages", [30, 40])
def test_snapshots_under_page_pressure_and_capacity(model, pages):  # noqa: F811
    """Three system prompts, four waves of one request each, capacity 2, in a small pool (30 pages of 4 ratio-4
    entries: the sequences are preempted too; 40: not): snapshots are evicted (least recently used first, or to make
    room) before anybody is preempted; every reply as without them."""
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=3, max_model_len=MAX_LEN, page_sizes=sizes, kept_states=2,
                                     num_pages={"compressed4": pages, "indexer4": pages})
    rng = random.Random(31)
    systems = [tokens(rng, n) for n in (70, 140, 200)]
    waves = [[(f"w{w}s{i}", s + tokens(rng, rng.randrange(3, 20)), 12) for i, s in enumerate(systems)]
             for w in range(4)]
    results, preemptions = {}, {}
    for snaps in (0, 2):
        engine = engine_with(model, snaps, cache=cache, max_num_seqs=3, budget=128)
        results[snaps] = run(engine, waves)
        preemptions[snaps] = engine.stats().num_preemptions
        if snaps:
            s = engine.stats()
            assert s.snapshots_taken >= 3 and s.num_snapshots <= 2 and (pages == 30 or s.num_forks >= 2)
            engine.snapshots.clear()
        assert_all_pages_free(engine)
    assert results[2] == results[0] and preemptions[2] <= preemptions[0]


def test_what_is_not_snapshotted(model):  # noqa: F811
    """No snapshot for a prefix shorter than one block, for prompts that share no whole block, or for a request
    asking for prompt logprobs; a prefix seen only in the request's own earlier admissions does not count."""
    rng = random.Random(37)
    short = tokens(rng, SNAPSHOT_BLOCK - 1)
    a, b = tokens(rng, 90), tokens(rng, 90)
    b[10] = a[10] = 5  # (one common token is no common block)
    engine = engine_with(model, 4)
    waves = [[("s0", short + [3], 3)], [("s1", short + [4], 3)], [("a", a, 3)], [("b", b, 3)]]
    run(engine, waves)
    engine.add_request("scored", a[:70] + [7], greedy(2, prompt_logprobs=0))
    drain(engine)
    assert engine.stats().snapshots_taken == 0
    assert_all_pages_free(engine)
    # a waiting request noted twice (blocked at admission) does not find its own blocks; another one does
    lone = Sequence("lone", tokens(rng, 150), greedy(2))
    assert engine.snapshots.note(lone) == 0 and engine.snapshots.note(lone) == 0
    other = Sequence("other", lone.prompt_token_ids[:140] + [3, 4], greedy(2))
    assert engine.snapshots.note(other) == 2 * SNAPSHOT_BLOCK


def test_config_errors():
    with pytest.raises(ValueError, match="prefix_snapshots=-1"):
        EngineConfig(prefix_snapshots=-1)
    with pytest.raises(ValueError, match="needs share_prompts"):
        EngineConfig(prefix_snapshots=2, share_prompts=False)
