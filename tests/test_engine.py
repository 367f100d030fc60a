"""LLMEngine on a real tiny DeepSeek-V4 checkpoint (fp32, CPU): batching, chunked prefill, continuous
batching, preemption, abort, seeded sampling and the FP8/FP4 cache storage.

References, independent of the engine's batching and paging:
* full-forward greedy loop: `model.compute_logits(model.forward(ids, arange))` re-run per step on the
  whole token list (no decode state at all);
* the engine with one request at a time and a budget large enough for any prompt in one chunk
  (itself checked against the full-forward loop).
The fp32 model accumulates in float64, so its results do not depend on batch composition or
chunking (model docstring) and greedy outputs must match exactly.

Layers sliding, CSA (ratio 4, indexer top-8), HCA (ratio 128), window 16 (ring 20 slots): prompts of
1..259 tokens cross the ring, ratio-4 and ratio-128 boundaries in prefill and in decode.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import dsv4
from dsv4.checkpoint.writer import random_master_weights, tiny_config, write_checkpoint
from dsv4.config import ModelConfig
from dsv4.engine.cache import CacheConfig
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.paged_state import cache_bytes_per_token
from dsv4.engine.sampling_params import SamplingParams

CFG = tiny_config("fp4", layers="sliding,csa,hca")
MAX_LEN = 288
# 16 prompts: single token, ratio-4 edges, ring (20) crossings, one that reaches 128 while decoding,
# and several that complete one or two HCA (ratio-128) entries during prefill.
LENGTHS = [1, 2, 3, 4, 6, 9, 15, 16, 17, 33, 61, 124, 129, 140, 200, 259]
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "configs"


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("engine_ckpt"), CFG, random_master_weights(CFG, seed=41))


@pytest.fixture(scope="module")
def model(ckpt):
    return dsv4.load_model(ckpt, dtype=torch.float32, numerics="reference")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(42)
    return [torch.randint(2, CFG.vocab_size, (n,), generator=g).tolist() for n in LENGTHS]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def max_tokens_of(i: int) -> int:
    return 8 + 4 * (i % 3)  # 8, 12, 16: requests finish at different steps


def make_engine(model, *, max_num_seqs: int = 16, budget: int = 4096, cache: CacheConfig | None = None,
                overlap: bool = True) -> LLMEngine:
    ec = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=MAX_LEN, cache=cache,
                      overlap=overlap)
    return LLMEngine(model, model.config, None, ec)


def drain(engine: LLMEngine, arrivals: dict[int, list[tuple]] | None = None, max_steps: int = 5000) -> dict:
    """Step until done, adding `arrivals[step]` (request_id, prompt, params) before that step.
    Returns request_id -> {"tokens", "logprobs", "finish_reason", "finished_deltas"}."""
    arrivals = dict(arrivals or {})
    out: dict[str, dict] = {}
    step = 0
    while engine.has_unfinished() or arrivals:
        for rid, ids, params in arrivals.pop(step, []):
            engine.add_request(rid, ids, params)
        for o in engine.step():
            r = out.setdefault(o.request_id, {"tokens": [], "logprobs": [], "finish_reason": None,
                                              "finished_deltas": 0, "prompt_logprobs": []})
            r["prompt_logprobs"].append(o.prompt_logprobs)
            r["tokens"] += o.token_ids
            r["logprobs"] += o.logprobs or []
            if o.finished:
                r["finish_reason"] = o.finish_reason
                r["finished_deltas"] += 1
        step += 1
        assert step < max_steps, "engine made no progress"
    return out


def assert_all_pages_free(engine: LLMEngine) -> None:
    s = engine.stats()
    assert (s.num_waiting, s.num_running) == (0, 0)
    assert s.free_pages == s.total_pages, f"{s.total_pages - s.free_pages} pages still held"
    assert engine.cache.states == {}


def full_forward_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation by re-running the whole sequence from scratch for every new token."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)))
            ids.append(int(model.compute_logits(hidden[-1:])[0].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def alone(model, prompts) -> list[list[int]]:
    """Each prompt alone through the engine, prefilled in one chunk."""
    outs = []
    for i, p in enumerate(prompts):
        engine = make_engine(model, max_num_seqs=1)
        engine.add_request("r", p, greedy(max_tokens_of(i)))
        res = drain(engine)["r"]
        assert res["finish_reason"] == "length" and res["finished_deltas"] == 1
        assert len(res["tokens"]) == max_tokens_of(i)
        assert_all_pages_free(engine)
        outs.append(res["tokens"])
    return outs


# ---- greedy equality ---------------------------------------------------------------------------

@pytest.mark.parametrize("i", [0, 8, 11])  # 1 token; 17 tokens; 124 tokens crossing 128 while decoding
def test_alone_matches_full_forward_greedy(model, prompts, alone, i):
    assert alone[i] == full_forward_greedy(model, prompts[i], max_tokens_of(i))


def test_outputs_are_not_degenerate(alone):
    """Guard against a vacuous comparison: different prompts give different continuations."""
    assert len({tuple(t) for t in alone}) >= 12


@pytest.mark.parametrize("max_num_seqs,budget", [(16, 4096), (16, 37), (5, 7)])
def test_batched_equals_alone(model, prompts, alone, max_num_seqs, budget):
    engine = make_engine(model, max_num_seqs=max_num_seqs, budget=budget)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, greedy(max_tokens_of(i)))
    out = drain(engine)
    for i in range(len(prompts)):
        r = out[f"r{i}"]
        assert r["tokens"] == alone[i], f"prompt {i} ({LENGTHS[i]} tokens)"
        assert r["finish_reason"] == "length" and r["finished_deltas"] == 1
    assert engine.scheduler.num_preemptions == 0
    assert_all_pages_free(engine)
    s = engine.stats()
    assert s.prompt_tokens_total == sum(LENGTHS)
    assert s.generation_tokens_total == sum(max_tokens_of(i) for i in range(len(prompts)))


def test_continuous_batching_arrivals_mid_flight(model, prompts, alone):
    rng = random.Random(7)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    arrivals: dict[int, list[tuple]] = {}
    for i in order:
        arrivals.setdefault(rng.randrange(0, 40), []).append((f"r{i}", prompts[i], greedy(max_tokens_of(i))))
    assert len(arrivals) >= 8  # really spread over many steps
    engine = make_engine(model, max_num_seqs=6, budget=61)
    out = drain(engine, arrivals)
    for i in range(len(prompts)):
        assert out[f"r{i}"]["tokens"] == alone[i], f"prompt {i} ({LENGTHS[i]} tokens)"
    assert_all_pages_free(engine)


def test_preemption_under_tiny_page_pool(model, prompts, alone):
    # compressed4 / indexer4 entries in pages of 4: one 288-token sequence needs 18 pages; 30 pages
    # hold far less than the ~250 entries the 16 prompts need together, so running requests must be
    # preempted (and recomputed) to make room.
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=16, max_model_len=MAX_LEN, page_sizes=sizes,
                                     num_pages={"compressed4": 30, "indexer4": 30})
    engine = make_engine(model, max_num_seqs=16, budget=97, cache=cache)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, greedy(max_tokens_of(i)))
    out = drain(engine)
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats().num_preemptions == engine.scheduler.num_preemptions
    for i in range(len(prompts)):
        r = out[f"r{i}"]
        assert r["tokens"] == alone[i], f"prompt {i} ({LENGTHS[i]} tokens)"
        assert r["finish_reason"] == "length" and r["finished_deltas"] == 1
    assert_all_pages_free(engine)


@pytest.mark.parametrize("overlap", [False, True])
def test_priorities_preempt_and_reorder_without_changing_outputs(model, prompts, alone, overlap):
    """Random priorities, arrivals spread over the first steps, 3 sequences at a time in a tiny pool: higher
    priorities preempt lower ones to get in (with the engine's look-ahead too); every output as computed alone."""
    rng = random.Random(3)
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=3, max_model_len=MAX_LEN, page_sizes=sizes,
                                     num_pages={"compressed4": 30, "indexer4": 30})
    engine = make_engine(model, max_num_seqs=3, budget=97, cache=cache, overlap=overlap)
    arrivals: dict[int, list[tuple]] = {}
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens_of(i), ignore_eos=True,
                                priority=rng.randrange(-2, 3))
        arrivals.setdefault(rng.randrange(0, 12), []).append((f"r{i}", p, params))
    made_way, inner = [], engine.scheduler._make_way
    engine.scheduler._make_way = lambda seq, batch: made_way.append(inner(seq, batch)) or made_way[-1]
    out = drain(engine, arrivals)
    assert any(freed is not None for freed in made_way)  # a higher priority took a running one's place
    assert [out[f"r{i}"]["tokens"] for i in range(len(prompts))] == [alone[i] for i in range(len(prompts))]
    assert_all_pages_free(engine)


def test_prompt_logprobs_match_full_forward_under_chunks_and_preemption(model, prompts, alone):
    """SamplingParams.prompt_logprobs: every prompt token after the first scored by the float64 log_softmax of a
    full forward over the prompt (no cache), top-3 included, once, on the request's first output -- with
    prefill cut into chunks of a 97-token budget shared by 16 requests and preempted sequences recomputed (their
    scores kept, not scored twice). Generated tokens as without it."""
    sizes = {"window": 8, "compressed4": 4, "indexer4": 4, "compressed128": 1}
    cache = CacheConfig.for_capacity(CFG, max_num_seqs=16, max_model_len=MAX_LEN, page_sizes=sizes,
                                     num_pages={"compressed4": 30, "indexer4": 30})
    engine = make_engine(model, max_num_seqs=16, budget=97, cache=cache)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, greedy(max_tokens_of(i), prompt_logprobs=3))
    out = drain(engine)
    assert engine.scheduler.num_preemptions > 0
    for i, p in enumerate(prompts):
        r = out[f"r{i}"]
        assert r["tokens"] == alone[i]
        first, *rest = r["prompt_logprobs"]
        assert first is not None and all(x is None for x in rest)  # the first output only
        assert len(first) == len(p) and first[0] is None
        with torch.inference_mode():
            logits = model.compute_logits(model.forward(torch.tensor(p), torch.arange(len(p))))
        ref = torch.log_softmax(logits.double(), -1)
        for k, got in enumerate(first[1:]):  # prompt token k + 1, scored at position k
            assert got.token_id == p[k + 1]
            assert abs(got.logprob - ref[k, p[k + 1]].item()) < 1e-5, (i, k)
            top = torch.sort(ref[k], descending=True, stable=True)
            assert [t for t, _ in got.top] == top.indices[:3].tolist()
            assert [v for _, v in got.top] == pytest.approx(top.values[:3].tolist(), abs=1e-5)
    assert_all_pages_free(engine)


# ---- abort -------------------------------------------------------------------------------------

def test_abort_mid_prefill_and_mid_decode_frees_pages(model, prompts, alone):
    engine = make_engine(model, max_num_seqs=4, budget=23)
    engine.add_request("long", prompts[15], greedy(16))      # 259 tokens: many prefill chunks
    engine.add_request("keep", prompts[9], greedy(max_tokens_of(9)))
    engine.add_request("dec", prompts[4], greedy(16))
    before = engine.stats().free_pages
    engine.step()
    engine.step()
    seq = engine.scheduler.requests["long"]
    assert 0 < seq.num_computed_tokens < LENGTHS[15] and seq.num_output_tokens == 0  # mid-prefill
    assert engine.stats().free_pages < before
    engine.abort_request("long")
    assert "long" not in engine.scheduler.requests and "long" not in engine.cache.states
    got = {"keep": [], "dec": []}
    while engine.scheduler.requests["dec"].num_output_tokens < 3:
        for o in engine.step():
            got[o.request_id] += o.token_ids
    engine.abort_request("dec")  # mid-decode
    engine.abort_request("nonexistent")  # unknown ids are ignored
    assert got["dec"] == alone[4][: len(got["dec"])]
    out = drain(engine)
    assert "long" not in out and "dec" not in out
    assert got["keep"] + out["keep"]["tokens"] == alone[9]
    assert_all_pages_free(engine)


# ---- sampling ----------------------------------------------------------------------------------

def test_seeded_sampling_independent_of_batch(model, prompts):
    def seeded(seed: int) -> SamplingParams:
        return SamplingParams(temperature=0.9, top_p=0.95, seed=seed, max_tokens=12, ignore_eos=True)

    def run(neighbours: list[int], budget: int, extra: dict | None = None) -> dict:
        engine = make_engine(model, max_num_seqs=8, budget=budget)
        for i in neighbours[: len(neighbours) // 2]:  # some requests ahead of "x" in the batch ...
            engine.add_request(f"n{i}", prompts[i], SamplingParams(temperature=1.0, seed=None if i % 2 else 99 + i,
                                                                   max_tokens=10))
        engine.add_request("x", prompts[10], seeded(1234))
        for rid, p in (extra or {}).items():
            engine.add_request(rid, prompts[10], p)
        for i in neighbours[len(neighbours) // 2:]:  # ... and some behind it
            engine.add_request(f"n{i}", prompts[i], SamplingParams(temperature=1.0, seed=None if i % 2 else 99 + i,
                                                                   max_tokens=10))
        out = drain(engine)
        assert_all_pages_free(engine)
        return {rid: r["tokens"] for rid, r in out.items()}

    first = run([], 4096)["x"]
    assert len(first) == 12
    batched = run([1, 4, 7, 11], 31, extra={"y": seeded(1235), "z": seeded(1234)})
    assert batched["x"] == first
    assert batched["z"] == first      # the same seed in the same batch: the same draws
    assert batched["y"] != first      # the seed matters
    assert run([3, 0, 5], 4096)["x"] == first


# ---- FP8 KV / FP4 indexer-key storage ----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_kv_cache_lossless_under_reference_numerics(ckpt, model, prompts, dtype):
    m = model if dtype == torch.float32 else dsv4.load_model(ckpt, dtype=dtype, numerics="reference")
    picks = [2, 8, 10, 13]  # 3, 17, 61, 140 tokens (two ratio-4 windows of indexer keys and more)
    results = {}
    for kv_dtype in ("auto", "fp8"):
        cache = CacheConfig.for_capacity(CFG, max_num_seqs=4, max_model_len=MAX_LEN, kv_dtype=kv_dtype)
        engine = make_engine(m, max_num_seqs=4, budget=53, cache=cache)
        for i in picks:
            engine.add_request(f"r{i}", prompts[i], greedy(6, logprobs=5))
        results[kv_dtype] = drain(engine)
        assert_all_pages_free(engine)
    fp8_pool = engine.cache.pools.entries[1, "main"]
    assert fp8_pool.q.dtype == torch.float8_e4m3fn and engine.cache.pools.entries[1, "index"].fp4
    for i in picks:
        a, b = results["auto"][f"r{i}"], results["fp8"][f"r{i}"]
        assert a["tokens"] == b["tokens"]
        assert len(a["logprobs"]) == 6
        for la, lb in zip(a["logprobs"], b["logprobs"]):
            assert la.logprob == lb.logprob and la.top == lb.top and len(la.top) == 5


# ---- cache size arithmetic ---------------------------------------------------------------------

def expected_bytes_per_token(cfg: dict, kv: str) -> float:
    """deepseek_v4_model.md §3.2 from the raw config.json: entries per token x bytes per entry."""
    ratios = cfg["compress_ratios"][: cfg["num_hidden_layers"]]  # the last entry is the MTP block
    main_entries = sum(1 / r for r in ratios if r)
    index_keys = sum(1 / r for r in ratios if r == 4)
    head, rope, index_dim = cfg["head_dim"], cfg["qk_rope_head_dim"], cfg["index_head_dim"]
    if kv == "bf16":
        main_bytes, index_bytes = 2 * head, 2 * index_dim
    else:  # e4m3 nope + one E8M0 byte per 64 nope dims + 1 pad byte + bf16 rope; e2m1 key + E8M0 per 32
        nope = head - rope
        main_bytes, index_bytes = nope + nope // 64 + 1 + 2 * rope, index_dim // 2 + index_dim // 32
    return main_entries * main_bytes + index_keys * index_bytes


@pytest.mark.parametrize("name,bf16_table,fp8_table", [
    ("deepseek-v4-flash", 6880, 3514.25), ("deepseek-v4-pro", 9848, 5031.4375)])
def test_cache_bytes_per_token_released_configs(name, bf16_table, fp8_table):
    path = CONFIGS_DIR / f"{name}.config.json"
    raw = json.loads(path.read_text())
    config = ModelConfig.from_file(path)
    for kv, table in (("bf16", bf16_table), ("fp8", fp8_table)):
        expected = expected_bytes_per_token(raw, kv)
        assert expected == table  # the derivation reproduces the spec table
        got = cache_bytes_per_token(config, "auto" if kv == "bf16" else "fp8", torch.bfloat16)
        assert sum(got.values()) == expected
        assert set(got) == {"compressed4", "compressed128", "indexer4"}


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_pool_storage_matches_bytes_per_token(kv_dtype):
    """The bytes the pools really allocate per entry (tiny config, bf16) are the §3.2 layout: the
    reported figure counts the fp8_ds_mla pad byte, which the pools do not allocate."""
    from dsv4.engine.cache import HybridCache
    cache = HybridCache(CFG, CacheConfig.for_capacity(CFG, max_num_seqs=2, max_model_len=MAX_LEN,
                                                      kv_dtype=kv_dtype), dtype=torch.bfloat16, device="cpu")
    nope, rope, index_dim = CFG.head_dim - CFG.rope_dim, CFG.rope_dim, CFG.index_head_dim
    if kv_dtype == "auto":
        main_real, main_reported, index_bytes = 2 * CFG.head_dim, 2 * CFG.head_dim, 2 * index_dim
    else:
        main_real = nope + nope // 64 + 2 * rope
        main_reported, index_bytes = main_real + 1, index_dim // 2 + index_dim // 32
    for (layer, name), pool in cache.pools.entries.items():
        tensors = [t for t in (getattr(pool, a, None) for a in ("q", "s", "rope", "data")) if t is not None]
        slots = tensors[0].shape[0] * tensors[0].shape[1]
        per_slot = sum(t.numel() * t.element_size() for t in tensors) / slots
        assert per_slot == (main_real if name == "main" else index_bytes), (layer, name)
    ratios = CFG.compress_ratios[: CFG.num_layers]
    expected = {f"compressed{r}": ratios.count(r) * main_reported / r for r in (4, 128)}
    expected["indexer4"] = ratios.count(4) * index_bytes / 4
    assert cache.bytes_per_token() == expected
    assert cache_bytes_per_token(CFG, kv_dtype, torch.bfloat16) == expected
