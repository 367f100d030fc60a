"""The engine's overlap (`LLMEngine.step` launching the next decode batch before it reads the ids back):
the same outputs as the engine without it, on the fp32 tiny checkpoint of test_engine (whose results do not
depend on batch composition), and look-aheads really launched, wasted where a sequence stops, and never
made for rows the host must see first (penalties, logprobs)."""
from __future__ import annotations

import pytest
import torch

from dsv4.engine.sampling_params import SamplingParams
from test_engine import (alone, assert_all_pages_free, ckpt, drain, greedy, make_engine,  # noqa: F401 (fixtures)
                         max_tokens_of, model, prompts)


def count_look_aheads(engine) -> dict[str, list[int]]:
    """request id -> the positions of the continuation rows scheduled for it (wraps the scheduler's look-ahead;
    a row at position p feeds the token sampled there)."""
    rows: dict[str, list[int]] = {}
    inner = engine.scheduler.schedule_continuation

    def spy(batch_rows):
        out = inner(batch_rows)
        for r in out.rows if out is not None else ():
            rows.setdefault(r.seq.request_id, []).append(r.start)
        return out
    engine.scheduler.schedule_continuation = spy
    return rows


def mixed_requests(prompts, stop_token: int | None) -> list[tuple]:
    reqs = [(f"g{i}", prompts[i], greedy(max_tokens_of(i))) for i in (0, 3, 8, 11, 13)]
    reqs += [(f"s{i}", prompts[i], SamplingParams(temperature=0.9, top_p=0.9, seed=50 + i, max_tokens=14,
                                                   ignore_eos=True)) for i in (5, 9)]
    if stop_token is not None:  # stops on a token it generates mid-way (its next row was launched for nothing)
        reqs.append(("stop", prompts[12], greedy(16, stop_token_ids=[stop_token])))
    return reqs


def run(model, reqs, overlap: bool, **kw):
    engine = make_engine(model, max_num_seqs=8, budget=300, overlap=overlap, **kw)
    spy = count_look_aheads(engine)
    for rid, p, params in reqs:
        engine.add_request(rid, p, params)
    return engine, spy, drain(engine)


def test_overlap_equals_sync_and_looks_ahead(model, prompts, alone):
    _, _, probe = run(model, mixed_requests(prompts, None) + [("stop", prompts[12], greedy(16))], overlap=False)
    stop_token = probe["stop"]["tokens"][5]
    reqs = mixed_requests(prompts, stop_token)
    sync_engine, sync_spy, sync = run(model, reqs, overlap=False)
    engine, spy, got = run(model, reqs, overlap=True)
    assert sync_spy == {}
    assert got.keys() == sync.keys()
    for rid in sync:
        assert got[rid]["tokens"] == sync[rid]["tokens"], rid
        assert got[rid]["finish_reason"] == sync[rid]["finish_reason"], rid
        assert got[rid]["finished_deltas"] == 1, rid
    for i in (0, 3, 8, 11, 13):
        assert got[f"g{i}"]["tokens"] == alone[i]
    stopped = got["stop"]["tokens"]
    assert got["stop"]["finish_reason"] == "stop" and stopped[-1] == stop_token and len(stopped) <= 6
    # most tokens came from look-ahead rows (not the prefill chunks' steps, nor past max_tokens) ...
    made = sum(len(v) for v in spy.values())
    assert made >= 0.6 * sum(len(r["tokens"]) for r in got.values())
    assert all(len(starts) < len(got[rid]["tokens"]) or rid == "stop" for rid, starts in spy.items())
    # ... and one row fed the stop token itself: launched before the host saw it, computed for nothing
    assert len(prompts[12]) + len(stopped) - 1 in spy["stop"]
    stats = engine.stats()
    assert stats.look_ahead_steps >= made / len(reqs) and stats.look_ahead_wasted_rows >= 1
    assert (sync_stats := sync_engine.stats()).look_ahead_steps == sync_stats.look_ahead_wasted_rows == 0
    assert_all_pages_free(engine)
    # a look-ahead still in flight after the last output is dropped by the next step; the engine goes on
    engine.add_request("again", prompts[8], greedy(max_tokens_of(8)))
    assert drain(engine)["again"]["tokens"] == alone[8]
    assert_all_pages_free(engine)


def test_overlap_by_default_only_on_a_gpu(model):
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    assert LLMEngine(model, model.config, None, EngineConfig(max_model_len=64)).overlap is False  # a CPU model
    assert LLMEngine(model, model.config, None, EngineConfig(max_model_len=64, overlap=True)).overlap is True


def test_abort_and_arrival_while_a_look_ahead_is_in_flight(model, prompts, alone):
    engine = make_engine(model, max_num_seqs=8, budget=300)
    for i in (2, 6, 10):
        engine.add_request(f"r{i}", prompts[i], greedy(max_tokens_of(i)))
    got: dict[str, list[int]] = {}
    while engine._pending is None:
        for o in engine.step():
            got.setdefault(o.request_id, []).extend(o.token_ids)
    assert {r.seq.request_id for r in engine._pending.batch.rows} == {"r2", "r6", "r10"}
    engine.abort_request("r6")
    engine.add_request("late", prompts[7], greedy(max_tokens_of(7)))  # waits: no look-ahead until admitted
    out = drain(engine)
    assert "r6" not in out
    for rid, i in (("r2", 2), ("r10", 10)):
        assert got.get(rid, []) + out[rid]["tokens"] == alone[i], rid
    assert out["late"]["tokens"] == alone[7]
    assert_all_pages_free(engine)


@pytest.mark.parametrize("extra", [dict(repetition_penalty=1.3), dict(logprobs=2)])
def test_no_look_ahead_for_rows_the_host_must_see(model, prompts, extra):
    reqs = [("plain", prompts[4], greedy(10)), ("host", prompts[9], greedy(10, **extra))]
    _, _, sync = run(model, reqs, overlap=False)
    engine, spy, got = run(model, reqs, overlap=True)
    assert spy == {}
    assert {k: v["tokens"] for k, v in got.items()} == {k: v["tokens"] for k, v in sync.items()}
    assert [lp.logprob for lp in got["host"]["logprobs"]] == [lp.logprob for lp in sync["host"]["logprobs"]]
    seq = type("S", (), {"params": SamplingParams(**extra), "generator": None})()
    with pytest.raises(ValueError, match="penalties or logprobs"):
        engine.sampler.pick_sequences(torch.randn(1, 8), [seq])
