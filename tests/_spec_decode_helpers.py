"""Shared helpers of the MTP speculative decoding tests (test_spec_decode*.py):
the fp32 reference model, an engine with or without speculation, draining it, and its end-of-run invariants."""
from __future__ import annotations

import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.model import DeepseekV4ForCausalLM

MAX_LEN = 160
SMALL = tiny_config("fp4", layers="sliding", vocab_size=8)
PROMPT = [3, 5, 2]


def build_model(cfg, masters) -> DeepseekV4ForCausalLM:
    m = DeepseekV4ForCausalLM(cfg, torch.float32, "reference")
    m.load_weights(masters.items())
    m.load_mtp_weights(masters.items())
    m.finalize_weights()
    return m.eval()


def make_engine(model, k: int | None, *, max_num_seqs: int = 16, budget: int = 64, cache=None,
                max_len: int = MAX_LEN) -> LLMEngine:
    ec = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, max_model_len=max_len,
                      cache=cache, speculative="mtp" if k else None, num_draft_tokens=k or 1)
    return LLMEngine(model, model.config, None, ec)


def step(engine: LLMEngine, out: dict) -> None:
    for o in engine.step():
        r = out.setdefault(o.request_id, {"tokens": [], "logprobs": [], "finish": None})
        r["tokens"] += o.token_ids
        r["logprobs"] += o.logprobs or []
        if o.finished:
            r["finish"] = o.finish_reason


def drain(engine: LLMEngine, out: dict | None = None, max_steps: int = 3000) -> dict:
    out = {} if out is None else out
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return out
        step(engine, out)
    raise AssertionError("engine made no progress")


def assert_all_free(engine: LLMEngine) -> None:
    s = engine.stats()
    assert (s.num_waiting, s.num_running) == (0, 0)
    assert s.free_pages == s.total_pages and engine.cache.states == {}
    assert engine.speculator is None or engine.speculator._seeds == {}
