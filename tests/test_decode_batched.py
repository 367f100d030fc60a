"""The batched decode attention (`Attention._attend_decode`: one token per sequence, keys padded per
sequence) against the per-sequence path, on sequences whose windows, compressed entries (ratio 4 and
128) and indexer selections all differ (contiguous states here; the engine's paged states take the
same path in tests/test_engine.py, batched ≡ alone)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dsv4

from dsv4.checkpoint.writer import tiny_config
from dsv4.model import DeepseekV4ForCausalLM, ForwardContext, set_forward_context
from dsv4.model.attention import Attention

PROMPTS = (3, 130, 7, 262, 1, 40)  # around the window (16), ratio 4 and ratio 128 boundaries


def _model(dtype):
    """float32: a random tiny model (float64 accumulation makes any difference show); bfloat16: the
    trained embedded model (a random model amplifies bf16 rounding differences chaotically)."""
    if dtype == torch.bfloat16:
        from dsv4 import load_model
        return load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cpu", dtype)
    cfg = tiny_config("fp4", "sliding,csa,hca,csa", num_hash_layers=1, index_topk=8)
    m = DeepseekV4ForCausalLM(cfg, dtype)
    m.load_random_weights(11)
    return m


def _decode(model, states, steps: int, batched: bool, gen_seed: int = 0):
    gen = torch.Generator().manual_seed(gen_seed)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.randint(2, 500, (len(states),), generator=gen)
            if batched:
                with set_forward_context(ForwardContext([1] * len(states), states)):
                    out.append(model.compute_logits(model(ids, torch.tensor([s.num_tokens for s in states]))))
            else:
                rows = []
                for i, s in enumerate(states):
                    with set_forward_context(ForwardContext([1], [s])):
                        rows.append(model.compute_logits(model(ids[i:i + 1], torch.tensor([s.num_tokens]))))
                out.append(torch.cat(rows))
    return torch.stack(out)


def _states(model):
    states = [model.new_sequence_state() for _ in PROMPTS]
    with torch.no_grad():
        for s, n in zip(states, PROMPTS):
            ids = torch.randint(2, 500, (n,), generator=torch.Generator().manual_seed(n))
            with set_forward_context(ForwardContext([n], [s])):
                model(ids, torch.arange(n))
    return states


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_decode_equals_per_sequence(dtype, monkeypatch):
    model = _model(dtype)
    calls = []
    real = Attention._attend_decode
    monkeypatch.setattr(Attention, "_attend_decode", lambda self, *a: calls.append(1) or real(self, *a))
    batched = _decode(model, _states(model), 40, batched=True)
    assert calls, "the batched decode path did not run"
    calls.clear()
    alone = _decode(model, _states(model), 40, batched=False)
    assert not calls
    if dtype == torch.float32:  # float64 accumulation: padding changes no rounding
        assert torch.equal(batched, alone)
    else:  # fp32 sums over padded rows may round differently
        rel = float((batched.double() - alone.double()).norm() / alone.double().norm())
        agree = float((batched.argmax(-1) == alone.argmax(-1)).double().mean())
        print(f"bf16 batched vs per-sequence: rel {rel:.2e}, argmax agreement {agree:.4f}")
        assert rel < 1e-2 and agree > 0.98, (rel, agree)


def test_batched_first_tokens_of_fresh_sequences():
    """One-token prompts prefilled together take the batched path with empty windows and no entries."""
    model = _model(torch.float32)
    ids = torch.tensor([5, 77, 301])
    fresh = [model.new_sequence_state() for _ in ids]
    with torch.no_grad(), set_forward_context(ForwardContext([1, 1, 1], fresh)):
        together = model.compute_logits(model(ids, torch.zeros(3, dtype=torch.long)))
    for i, t in enumerate(ids):
        st = model.new_sequence_state()
        with torch.no_grad(), set_forward_context(ForwardContext([1], [st])):
            assert torch.equal(model.compute_logits(model(t[None], torch.zeros(1, dtype=torch.long)))[0], together[i])
