"""Piecewise decode graphs (dsv4.model.graphs): the plumbing, run eagerly on CPU (`capture=False`),
must give the plain forward's results exactly; GPU capture is tested in tests/gpu/test_model_gpu.py."""
from __future__ import annotations

import pytest
import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.model import DeepseekV4ForCausalLM, ForwardContext, set_forward_context
from dsv4.model.rope import MAX_POSITION


def _model(seed: int):
    cfg = tiny_config("fp4", "sliding,csa,hca", num_hash_layers=1, sliding_window=8)
    m = DeepseekV4ForCausalLM(cfg, torch.float32)
    m.load_random_weights(seed)
    return m


def _run(model, prompts, steps, graphs: bool):
    """Prefill every prompt, then `steps` greedy decode steps of the whole batch (batch sizes vary:
    the shortest sequences stop early). Returns per-step logits and the MTP target streams."""
    if graphs:
        model.enable_cuda_graphs(max_batch=8, capture=False)
    else:
        model._graphs = None
    states = [model.new_sequence_state() for _ in prompts]
    gen = torch.Generator().manual_seed(0)
    nxt = []
    with torch.no_grad():
        for st, p in zip(states, prompts):
            with set_forward_context(ForwardContext([len(p)], [st])):
                nxt.append(int(model.compute_logits(model(p, torch.arange(len(p)))[-1:]).argmax()))
        out = []
        for step in range(steps):
            live = [i for i in range(len(states)) if step < 3 or i % 2 == 0]  # batch 5 then 3 (padded)
            ids = torch.tensor([nxt[i] for i in live])
            pos = torch.tensor([states[i].num_tokens for i in live])
            with set_forward_context(ForwardContext([1] * len(live), [states[i] for i in live])):
                logits = model.compute_logits(model(ids, pos))
            out.append((logits, model.get_mtp_target_hidden_states()))
            for j, i in enumerate(live):
                nxt[i] = int(logits[j].argmax()) if step % 3 else int(torch.randint(2, 500, (1,), generator=gen))
    return out


def test_graph_plumbing_equals_plain_forward():
    prompts = [torch.randint(2, 500, (n,), generator=torch.Generator().manual_seed(n)) for n in (3, 17, 9, 30, 1)]
    plain = _run(_model(2), prompts, 7, graphs=False)
    piecewise = _run(_model(2), prompts, 7, graphs=True)
    for (a, ra), (b, rb) in zip(plain, piecewise):
        assert torch.equal(a, b)
        assert torch.equal(ra, rb)


def test_graphs_leave_prefill_and_multi_token_steps_alone():
    m = _model(3)
    m.enable_cuda_graphs(max_batch=2, capture=False)
    st = [m.new_sequence_state() for _ in range(3)]
    with torch.no_grad(), set_forward_context(ForwardContext([4, 4, 4], st)):
        m(torch.randint(2, 500, (12,)), torch.arange(4).repeat(3))
    assert m._graphs._buckets == {}  # prefill ran the plain path
    with torch.no_grad(), set_forward_context(ForwardContext([1, 1, 1], st)):
        m(torch.randint(2, 500, (3,)), torch.tensor([4, 4, 4]))
    assert m._graphs._buckets == {}  # 3 sequences > max_batch 2: plain path
    with torch.no_grad(), set_forward_context(ForwardContext([1, 1], st[:2])):
        m(torch.randint(2, 500, (2,)), torch.tensor([5, 5]))
    assert list(m._graphs._buckets) == [2]


def test_capture_needs_cuda_and_finalized_weights():
    cfg = tiny_config("fp4", "sliding")
    m = DeepseekV4ForCausalLM(cfg, torch.float32)
    with pytest.raises(RuntimeError, match="finalize_weights"):
        m.enable_cuda_graphs()
    m.load_random_weights(0)
    with pytest.raises(ValueError, match="CUDA device"):
        m.enable_cuda_graphs()


def test_position_limit_checked_once_per_forward():
    """RoPE positions must be exact in fp32: checked once per batch from the host-side lengths."""
    from dsv4.model.context import sequence_spans

    st = _model(4).new_sequence_state()
    ctx = ForwardContext([2], [st])
    assert sequence_spans(ctx, torch.tensor([MAX_POSITION - 2, MAX_POSITION - 1]), [MAX_POSITION - 2]) == [(0, 2)]
    with pytest.raises(ValueError, match="2\\^24"):
        sequence_spans(ctx, torch.tensor([MAX_POSITION - 1, MAX_POSITION]), [MAX_POSITION - 1])
    with pytest.raises(ValueError, match="must continue its state"):
        sequence_spans(ctx, torch.tensor([3, 5]), [3])


def test_engine_with_graph_plumbing_generates_the_same_text():
    """The engine's paged decode steps through the graph code (run eagerly): greedy text identical."""
    from dsv4 import LLM, SamplingParams

    prompts = ["def main():", "The", "import os\nimport sys\n", "class A:\n    def"]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    llm = LLM()
    plain = [r.token_ids for r in llm.generate(prompts, params)]
    llm.engine.model.enable_cuda_graphs(max_batch=4, capture=False)
    piecewise = [r.token_ids for r in llm.generate(prompts, params)]
    assert piecewise == plain
    steps = llm.engine.model._graphs._steps  # the engine's decode batches ran as whole-step "graphs"
    assert any(size == 4 for (_, size, _) in steps) and not llm.engine.model._graphs._buckets
