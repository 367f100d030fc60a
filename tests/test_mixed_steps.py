"""Steps that mix decode rows with prompt chunks as two forwards (dsv4.model.mixed_steps, SPLIT_MIXED_STEPS): the
engine's greedy text equals the engine's without graphs (one forward per step), with requests arriving while others
decode, chunked prompts, MTP speculation (verify rows beside chunks; the MTP block reads the recombined target
rows, its catch-up over them split too); the mixed steps really went through the split, the decode rows through the
fixed-shape step's buckets.
Uncaptured graphs on the CPU (`capture=False`); on the GPU: bench/runs/run_device_s63a.sh."""
from __future__ import annotations

import pytest
import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams
from dsv4.model import DeepseekV4ForCausalLM, mixed_steps

from _split_spies import count_splits


def _engine(graphs: bool, speculative: str | None, pieces: bool = True) -> LLMEngine:
    cfg = tiny_config("fp4", "sliding,csa,hca", num_hash_layers=1, sliding_window=8)
    m = DeepseekV4ForCausalLM(cfg, torch.float32)
    m.load_random_weights(13)
    if graphs:
        m.enable_cuda_graphs(max_batch=8, capture=False)
    return LLMEngine(m, m.config, None, EngineConfig(max_num_seqs=6, max_num_batched_tokens=48, max_model_len=256,
                                                     speculative=speculative, num_draft_tokens=2,
                                                     prefill_graph_tokens=None if pieces else 0))


def _drain(engine: LLMEngine, arrivals: dict[int, list]) -> dict[str, list[int]]:
    """Each request's tokens; every MTP forward's hidden states land in `engine.mtp_hidden` (the drafts come from
    them: greedy text alone would not notice MTP inputs out of order, only fewer accepted drafts)."""
    engine.mtp_hidden = []
    real = engine.model.forward_mtp

    def forward_mtp(*args):
        res, hidden = real(*args)
        engine.mtp_hidden.append(hidden.clone())
        return res, hidden

    engine.model.forward_mtp = forward_mtp
    out: dict[str, list[int]] = {}
    step = 0
    while engine.has_unfinished() or any(k >= step for k in arrivals):
        for rid, ids, params in arrivals.get(step, []):
            engine.add_request(rid, ids, params)
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.token_ids)
        step += 1
        assert step < 2000
    return out


@pytest.mark.parametrize("one_pass, pieces", [(False, True), (True, True), (True, False), ("same-bucket", True)])
@pytest.mark.parametrize("speculative", [None, "mtp"])
def test_mixed_steps_split_keep_the_greedy_text(monkeypatch, speculative, one_pass, pieces):
    """The split, and its one pass through the prefill pieces or (pieces off) eagerly, always or where the decode
    rows fit in the chunks' bucket (here every mixed step: 2-4 decode rows beside chunks of 12-46 tokens)."""
    gen = torch.Generator().manual_seed(62)
    arrivals: dict[int, list] = {}
    for i, (step, n) in enumerate([(0, 5), (0, 30), (3, 70), (6, 12), (9, 40), (9, 3)]):
        prompt = torch.randint(2, 500, (n,), generator=gen).tolist()
        arrivals.setdefault(step, []).append((f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=14,
                                                                              ignore_eos=True)))
    plain = _engine(False, speculative)
    want = _drain(plain, arrivals)
    monkeypatch.setattr(mixed_steps, "SPLIT_MIXED_STEPS", True)
    monkeypatch.setattr(mixed_steps, "ONE_PASS_MIXED_STEPS", one_pass)
    split, mtp_split = count_splits(monkeypatch)
    engine = _engine(True, speculative, pieces)
    got = _drain(engine, arrivals)
    assert got == want and all(len(t) == 14 for t in got.values())
    assert len(engine.mtp_hidden) == len(plain.mtp_hidden) == (0 if speculative is None else len(plain.mtp_hidden))
    for i, (a, b) in enumerate(zip(plain.mtp_hidden, engine.mtp_hidden)):
        assert torch.equal(a, b), f"MTP forward {i}"
    if speculative:
        assert plain.mtp_hidden and engine.stats().spec_draft_tokens == plain.stats().spec_draft_tokens > 0
        assert sum(mtp_split) >= 3  # the MTP block's catch-up over those steps' rows was split too
    assert sum(split) >= 3  # (several steps mixed decode rows with a chunk: the 70-token prompt takes two steps)
    assert engine.model._graphs._steps  # the decode rows' fixed-shape step buckets
    assert bool(engine.model._graphs.head_steps) == bool(one_pass)  # one pass: their step inside the chunks' forward
    assert bool(engine.model._graphs._prefill) == pieces


def test_one_pass_only_where_the_decode_rows_fit_the_bucket(monkeypatch):
    """ONE_PASS_MIXED_STEPS = "same-bucket": one forward only where the decode rows beside the chunks' rows keep the
    prefill-pieces bucket the chunks alone take (both under the limit); never without graphs; other values rejected."""
    from dsv4.model.prefill_graphs import PREFILL_BUCKETS
    m = DeepseekV4ForCausalLM(tiny_config("fp4", "sliding"), torch.float32)
    m.load_random_weights(2)
    assert not mixed_steps.one_pass_fits(m, 1, 10)  # no graphs: no pieces
    m.enable_cuda_graphs(max_batch=8, capture=False)
    m._graphs.sharded = True  # (ranks keep the split)
    assert not mixed_steps.one_pass_fits(m, 1, 10)
    m._graphs.sharded = False
    small, top = PREFILL_BUCKETS[0], PREFILL_BUCKETS[-1]
    gen = torch.Generator().manual_seed(65)
    for _ in range(40):
        b = int(torch.randint(1, 9, (1,), generator=gen))
        bucket = PREFILL_BUCKETS[int(torch.randint(1, len(PREFILL_BUCKETS), (1,), generator=gen))]
        below = bucket // 2  # the next smaller bucket: chunks of below + 1 .. bucket tokens take `bucket`
        p = int(torch.randint(below + 1, bucket + 1, (1,), generator=gen))
        assert mixed_steps.one_pass_fits(m, b, p) == (p + b <= bucket), (b, p, bucket)
    assert mixed_steps.one_pass_fits(m, 3, small - 3) and not mixed_steps.one_pass_fits(m, 3, small - 2)
    assert not mixed_steps.one_pass_fits(m, 1, top)  # past the pieces' limit
    assert not mixed_steps.one_pass_fits(m, 1, top + 50)  # the chunks alone run eagerly
    m._graphs.prefill_limit = 64  # (the engine's prefill_graph_tokens, or lowered after an out-of-memory)
    assert mixed_steps.one_pass_fits(m, 2, 60) and not mixed_steps.one_pass_fits(m, 2, 63)
    parts = [(torch.arange(2), None), (torch.arange(2, 40), None)]
    for value, want in ((True, True), (False, False), ("same-bucket", True)):
        monkeypatch.setattr(mixed_steps, "ONE_PASS_MIXED_STEPS", value)
        assert mixed_steps.one_pass(m, parts) == want
    monkeypatch.setattr(mixed_steps, "ONE_PASS_MIXED_STEPS", "always")
    with pytest.raises(ValueError, match="ONE_PASS_MIXED_STEPS"):
        mixed_steps.one_pass(m, parts)


@pytest.mark.parametrize("lens, parts", [
    ([1, 1], None), ([9, 30], None), ([1, 9], ([0], [1])), ([5, 6, 3, 7], ([0, 2], [1, 3])),
    ([0, 1, 9], None), ([2, 1, 40, 1], ([0, 1, 3], [2]))])
def test_mixed_rows(lens, parts):
    """Decode rows bring 1 to max_rollback + 1 tokens (here 5); only a batch with both kinds (and no empty
    sequence) is split."""
    assert mixed_steps.mixed_rows(lens, 4) == parts


def test_decode_head_must_name_sequences_of_the_batch():
    from dsv4.model import ForwardContext
    m = DeepseekV4ForCausalLM(tiny_config("fp4", "sliding"), torch.float32)
    states = [m.new_sequence_state(), m.new_sequence_state()]
    for head in (-1, 3):
        with pytest.raises(ValueError, match=f"decode_head={head} for 2 sequences"):
            ForwardContext([1, 9], states, decode_head=head)
    assert ForwardContext([1, 9], states, decode_head=2).decode_head == 2
