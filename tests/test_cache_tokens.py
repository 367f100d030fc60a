"""EngineConfig.cache_tokens / --cache-tokens: the tokens of context the cache holds over all sequences, what
`dsv4 plan` prints for a GPU. References: the pool sizes re-derived from the page arithmetic (a ratio-r kind holds
one entry per r tokens; every holder rounds its last page up), and the scheduler's behaviour when the pool holds
one full-length sequence only (the others wait or are preempted, and every output is as with room to spare)."""
from __future__ import annotations

import math
import random

import pytest

from dsv4.cli import build_parser
from dsv4.engine.cache import DEFAULT_PAGE_SIZES
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams
from dsv4.planner import format_plan, plan
from test_engine import CFG, MAX_LEN, ckpt, drain, model  # noqa: F401  (fixtures)
from test_planner import needs_flash, flash, H200  # noqa: F401  (fixture)


def engine_with(model, cache_tokens, max_num_seqs=4, retain=0, budget=64):  # noqa: F811
    return LLMEngine(model, model.config, None, EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                                             max_model_len=MAX_LEN, cache_tokens=cache_tokens,
                                                             retain_finished=retain))


@pytest.mark.parametrize("tokens, retain", [(1000, 0), (3 * MAX_LEN + 17, 2)])
def test_pool_sizes_follow_the_token_count(model, tokens, retain):  # noqa: F811
    bm = engine_with(model, tokens, retain=retain).block_manager
    holders = 4 + retain
    for r in sorted(set(CFG.compress_ratios) - {0}):
        for kind in ((f"compressed{r}", f"indexer{r}") if r == 4 else (f"compressed{r}",)):
            assert bm.num_total(kind) == math.ceil(tokens / r / DEFAULT_PAGE_SIZES[kind]) + holders, kind
    assert bm.num_total("state") == holders


def test_a_small_cache_holds_fewer_sequences_at_once(model):  # noqa: F811
    """cache_tokens = max_model_len gives 6 ratio-4 pages (2 of bulk + 1 per holder's rounding); 4 near-full-length
    prompts, prefilled together, need 2 each: with it they never hold more than 6 (one is preempted), with room for
    4 full-length sequences all 8 at once. The outputs are the same."""
    rng = random.Random(4)
    prompts = [[rng.randrange(2, CFG.vocab_size) for _ in range(MAX_LEN - 40)] for _ in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs, peaks = [], []
    for tokens in (MAX_LEN, 4 * MAX_LEN):
        engine = engine_with(model, tokens, budget=1024)
        bm, step, held = engine.block_manager, engine.step, []

        def counted(step=step, bm=bm, held=held):
            out = step()
            held.append(bm.num_total("compressed4") - bm.num_free("compressed4"))
            return out

        engine.step = counted
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", p, params)
        outs.append({k: v["tokens"] for k, v in drain(engine).items()})
        peaks.append(max(held))
    assert outs[0] == outs[1] and peaks == [6, 8]


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_config_errors(bad):
    with pytest.raises(ValueError, match="cache_tokens"):
        EngineConfig(cache_tokens=bad)


def test_fewer_than_one_full_length_sequence_is_refused(model):  # noqa: F811
    with pytest.raises(ValueError, match=f"cache_tokens={MAX_LEN - 1} is less than max_model_len={MAX_LEN}"):
        engine_with(model, MAX_LEN - 1)


@pytest.mark.parametrize("command", ["serve", "generate", "run-batch"])
def test_the_option_reaches_the_engine_config(command, monkeypatch):
    from dsv4.cli_generate import check_cache_tokens
    extra = {"serve": [], "generate": ["x"], "run-batch": ["-i", "a.jsonl", "-o", "b.jsonl"]}[command]
    args = build_parser().parse_args([command, "--cache-tokens", "5000", "--max-model-len", "4096", *extra])
    assert args.cache_tokens == 5000
    check_cache_tokens(args)
    args = build_parser().parse_args([command, "--cache-tokens", "4000", "--max-model-len", "4096", *extra])
    with pytest.raises(ValueError, match="--cache-tokens 4000 is less than --max-model-len 4096"):
        check_cache_tokens(args)


@needs_flash
def test_plan_prints_the_serve_options(flash):  # noqa: F811
    p = plan(flash, gpus=2, gpu_memory=H200, kv_dtype="fp8", max_num_seqs=32, kept_states=16)
    assert p.fits and p.kept_states == 16
    assert p.cache_tokens == int((int(H200 * 0.9) - p.weights - (32 + 16) * p.fixed_per_sequence)
                                 // p.cache_bytes_per_token)
    # FP8 is serve's cache on a GPU: only the other storage is spelled out
    assert format_plan(p).splitlines()[-1] == f"serve with: --max-num-seqs 32 --cache-tokens {p.cache_tokens}"
    auto = plan(flash, gpus=2, gpu_memory=H200, kv_dtype="auto", max_num_seqs=32, kept_states=16)
    assert format_plan(auto).splitlines()[-1] == \
        f"serve with: --max-num-seqs 32 --cache-tokens {auto.cache_tokens} --kv-dtype auto"
    assert "serve with" not in format_plan(plan(flash, gpus=1, gpu_memory=H200))
