"""Decode state: any chunking of a sequence, a packed batch of sequences, and rollback + recompute give
the same logits as one full forward of each sequence alone (tiny fp32 models, both numerics).

Layers sliding, CSA, HCA, CSA with the real 128-token window, 16 indexer heads and index_topk 8 (so
the indexer really selects once a query sees more than 8 entries); sequences of 300 tokens complete
two HCA entries and cross the ring capacity (window + max_rollback)."""
from __future__ import annotations

import pytest
import torch

from dsv4.checkpoint.writer import random_master_weights, tiny_config
from dsv4.model import DeepseekV4ForCausalLM, ForwardContext, set_forward_context

TOL = 1e-5  # max |a - b| / max |b| over all logits
LENGTH = 300
CFG = tiny_config("fp4", sliding_window=128)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.fixture(scope="module", params=["reference", "transformers"])
def model(request):
    masters = random_master_weights(CFG, seed=21)
    m = DeepseekV4ForCausalLM(CFG, torch.float32, request.param)
    m.load_weights(masters.items())
    m.load_mtp_weights(masters.items())
    m.finalize_weights()
    return m


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, CFG.vocab_size, (LENGTH,), generator=torch.Generator().manual_seed(22))


@pytest.fixture(scope="module")
def full(model, ids):
    """Logits and pre-hc_head residual of one forward over the whole sequence (no context)."""
    with torch.no_grad():
        logits = model.compute_logits(model(ids, torch.arange(LENGTH)))
    return logits, model.get_mtp_target_hidden_states().clone()


def step(model, state, ids, start, n):
    with torch.no_grad(), set_forward_context(ForwardContext([n], [state])):
        return model.compute_logits(model(ids[start:start + n], torch.arange(start, start + n)))


def run_chunks(model, ids, chunks, state=None):
    state = state or model.new_sequence_state()
    out, start = [], state.num_tokens
    for n in chunks:
        out.append(step(model, state, ids, start, n))
        start += n
    return torch.cat(out), state


def test_no_context_is_one_fresh_sequence(model, ids, full):
    got, state = run_chunks(model, ids, [LENGTH])
    assert rel(got, full[0]) <= TOL and state.num_tokens == LENGTH
    assert state.layers[2].num_entries("main") == 2 and state.layers[1].num_entries("index") == 75


def test_prefill_then_decode_one_token_at_a_time(model, ids, full):
    # decode across the HCA/ring boundaries 127..132 and across 255/256
    chunks = [124] + [1] * 12 + [114] + [1] * 11
    got, _ = run_chunks(model, ids, chunks)
    assert got.shape[0] == sum(chunks)
    assert rel(got, full[0][: sum(chunks)]) <= TOL


@pytest.mark.parametrize("chunks,max_rollback", [
    ([5, 3, 7, 113, 1, 1, 2, 126, 42], 0),  # odd sizes crossing 4-, 128- and ring boundaries; minimal state
    ([128, 128, 44], 4),                     # aligned to the HCA windows
    ([131, 129, 40], 2),                     # each chunk crosses a ratio-128 boundary
])
def test_any_chunking_equals_full_forward(model, ids, full, chunks, max_rollback):
    got, state = run_chunks(model, ids, chunks, model.new_sequence_state(max_rollback))
    assert rel(got, full[0]) <= TOL
    assert state.layers[2].num_entries("main") == 2 and state.layers[3].num_entries("index") == 75


def test_packed_batch_equals_each_sequence_alone(model, ids, full):
    g = torch.Generator().manual_seed(23)
    seqs = [ids, torch.randint(0, CFG.vocab_size, (131,), generator=g),
            torch.randint(0, CFG.vocab_size, (7,), generator=g)]
    alone = [full[0]] + [run_chunks(model, s, [len(s)])[0] for s in seqs[1:]]
    states = [model.new_sequence_state() for _ in seqs]
    plan = [[200, 100, 5], [99, 30, 0], [1, 1, 2]]  # per forward: tokens of each sequence (0 = idle)
    got = [[] for _ in seqs]
    for lens in plan:
        batch_ids, batch_pos = [], []
        for s, n, st in zip(seqs, lens, states):
            batch_ids.append(s[st.num_tokens: st.num_tokens + n])
            batch_pos.append(torch.arange(st.num_tokens, st.num_tokens + n))
        with torch.no_grad(), set_forward_context(ForwardContext(lens, states)):
            logits = model.compute_logits(model(torch.cat(batch_ids), torch.cat(batch_pos)))
        for i, part in enumerate(torch.split(logits, lens)):
            got[i].append(part)
    for i, s in enumerate(seqs):
        assert states[i].num_tokens == len(s)
        assert rel(torch.cat(got[i]), alone[i]) <= TOL


@pytest.mark.parametrize("prefix,wrong,keep", [
    (126, 4, 0),   # the rejected tokens complete HCA entry 0 and CSA entries 31, 32
    (253, 4, 1),   # rejected 254..256 cross entry completions at 255; one draft token kept
    (40, 2, 0),    # mid-window rollback
])
def test_truncate_then_recompute_equals_uninterrupted(model, ids, full, prefix, wrong, keep):
    _, state = run_chunks(model, ids, [prefix])
    drafts = ids.clone()
    drafts[prefix + keep: prefix + wrong] = (drafts[prefix + keep: prefix + wrong] + 7) % CFG.vocab_size
    for t in range(prefix, prefix + wrong):  # speculative tokens, verified one by one
        step(model, state, drafts, t, 1)
    state.truncate(wrong - keep)
    assert state.num_tokens == prefix + keep
    resumed, _ = run_chunks(model, ids, [3, 1, 9], state)
    start = prefix + keep
    assert rel(resumed, full[0][start:start + 13]) <= TOL


def test_truncate_a_prefill_chunk(model, ids, full):
    _, state = run_chunks(model, ids, [250])
    state.truncate(4)
    got, _ = run_chunks(model, ids, [50], state)
    assert rel(got, full[0][246:296]) <= TOL


def test_mtp_chunked_equals_full_and_rolls_back(model, ids, full):
    residual = full[1]
    with torch.no_grad():
        want_res, want_hidden = model.forward_mtp(residual[:-1], ids[1:], torch.arange(LENGTH - 1))
        want = model.mtp[0].compute_logits(want_hidden)
    assert want_res.shape == (LENGTH - 1, CFG.hc_mult * CFG.hidden_size)
    state = model.new_sequence_state()
    got, start = [], 0
    for n in [130, 1, 1, 4, 100, 63]:
        if n == 4:  # a rejected chain of drafts, then rollback of the MTP state
            with torch.no_grad(), set_forward_context(ForwardContext([n], [state])):
                model.forward_mtp(residual[start:start + n] * 0.5, ids[start + 1:start + n + 1],
                                  torch.arange(start, start + n))
            state.mtp.truncate(n)
        with torch.no_grad(), set_forward_context(ForwardContext([n], [state])):
            _, hidden = model.forward_mtp(residual[start:start + n], ids[start + 1:start + n + 1],
                                          torch.arange(start, start + n))
        got.append(model.compute_logits(hidden))
        start += n
    assert state.mtp.num_tokens == LENGTH - 1 and state.num_tokens == 0
    assert rel(torch.cat(got), want) <= TOL
