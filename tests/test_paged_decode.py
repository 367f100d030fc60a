"""Fixed-shape decode steps over the paged pools (dsv4.engine.paged_decode, `Attention._attend_step`)
against the per-sequence path on the *same* pools: sequences whose windows, ratio-4 and ratio-128
compressed entries and indexer selections differ, windows closing at different steps, rollbacks
(as MTP verification does), graph-bucket padding rows, FP8/FP4 storage."""
from __future__ import annotations

import pytest
import torch

import dsv4.model.deepseek_v4 as dsv4_model
from dsv4.checkpoint.writer import tiny_config
from dsv4.model import DeepseekV4ForCausalLM, ForwardContext, set_forward_context
from dsv4.model.attention import Attention

from paged_driver import PagedBatch as _Batch  # noqa: E402

def _model():
    cfg = tiny_config("fp4", "sliding,csa,hca,csa", num_hash_layers=1, index_topk=8)
    m = DeepseekV4ForCausalLM(cfg, torch.float32)
    m.load_random_weights(5)
    return m


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_step_equals_per_sequence_path(kv_dtype, monkeypatch):
    calls = []
    real = Attention._attend_step
    monkeypatch.setattr(Attention, "_attend_step", lambda self, *a: calls.append(1) or real(self, *a))
    stepped = _Batch(_model(), kv_dtype).decode(40)
    assert calls, "the fixed-shape step did not run"
    monkeypatch.setattr(dsv4_model, "paged_step_pools", lambda ctx: None)  # force the per-sequence path
    calls.clear()
    alone = _Batch(_model(), kv_dtype).decode(40)
    assert not calls
    worst = 0.0
    for a, b in zip(stepped, alone):
        worst = max(worst, float(((a.double() - b.double()).abs().max() / b.double().abs().max())))
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    print(f"{kv_dtype}: step vs per-sequence max rel {worst:.2e}")
    assert worst < 1e-5  # float64 accumulation; only summation order differs (gathered top-k vs masked all)


def test_padded_rows_touch_no_state():
    """Graph-bucket padding (capture=False runs the graph's code eagerly): a batch of 5 in a bucket of
    8, then the same steps unpadded, give identical logits and leave identical pools."""
    runs = []
    for graphs in (True, False):
        m = _model()
        if graphs:
            m.enable_cuda_graphs(max_batch=8, capture=False)
        b = _Batch(m, "fp8")
        runs.append((b.decode(12, seed=3), b.cache.pools))
        if graphs:
            assert any(size == 8 for (_, size, _) in m._graphs._steps)
    (a, pa), (b, pb) = runs
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    for key, pool in pa.entries.items():
        other = pb.entries[key]
        for name in ("q", "s", "rope", "data"):
            if hasattr(pool, name):  # the trash page may differ (it is never read unmasked)
                assert torch.equal(getattr(pool, name)[:-1], getattr(other, name)[:-1]), key


def test_missing_pages_are_named():
    m = _model()
    b = _Batch(m, "auto")
    seq = b.seqs[3]
    seq.block_tables["compressed4"] = seq.block_tables["compressed4"][:-1]  # as if never allocated
    states = [b.cache.state_of(seq)]
    with pytest.raises(RuntimeError, match="'r3'.*compressed4"):
        with torch.no_grad(), set_forward_context(ForwardContext([1], states)):
            m(torch.tensor([5]), torch.tensor([states[0].num_tokens]))


def test_step_state_work_reads_nothing_back(monkeypatch):
    """What a CUDA graph captures must not read tensor values on the host (capture fails on the GPU:
    an `.item()`, `bool()` or `int()` of a device tensor). On CPU: every such read raises inside the
    step's index derivation and the attention's state work, for FP8/FP4 pools and a padded bucket.
    (The torch MoE reads expert ids back; graphs run the Triton MoE, checked on the GPU.)"""
    from dsv4.engine.paged_decode import DecodeStep

    banned = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")
    runs = []

    def guard(fn):
        def guarded(*args):
            saved = {name: getattr(torch.Tensor, name) for name in banned}

            def refuse(name):
                def f(*a, **k):
                    raise AssertionError(f"host read Tensor.{name} inside a captured decode step")
                return f
            try:
                for name in banned:
                    setattr(torch.Tensor, name, refuse(name))
                return fn(*args)
            finally:
                for name, f in saved.items():
                    setattr(torch.Tensor, name, f)
                runs.append(fn.__name__)
        return guarded

    monkeypatch.setattr(DecodeStep, "derive", guard(DecodeStep.derive))
    monkeypatch.setattr(Attention, "_attend_step", guard(Attention._attend_step))
    m = _model()
    m.enable_cuda_graphs(max_batch=8, capture=False)
    _Batch(m, "fp8").decode(6)
    assert "derive" in runs and "_attend_step" in runs
    assert any(size == 8 for (_, size, _) in m._graphs._steps)


def test_mtp_draft_step_equals_per_sequence_path(monkeypatch):
    """The MTP block's draft rows over the paged pools (one or two per sequence, as chained drafts
    and their catch-up rows) take the fixed-shape step; same logits as its per-sequence path."""
    import dsv4.model.mtp as mtp_module

    def drafts(b):
        m, gen, out = b.model, torch.Generator().manual_seed(9), []
        width = m.config.hc_mult * m.config.hidden_size
        with torch.no_grad():
            for step in range(9):
                lens = [1 + (i + step) % 2 for i in range(len(b.states))]
                pos = torch.cat([torch.arange(s.mtp.num_tokens, s.mtp.num_tokens + n) for s, n in zip(b.states, lens)])
                res = torch.randn(pos.numel(), width, generator=gen)
                ids = torch.randint(2, 500, (pos.numel(),), generator=gen)
                with set_forward_context(ForwardContext(lens, b.states)):
                    _, hidden = m.forward_mtp(res, ids, pos)
                out.append(m.mtp[0].compute_logits(hidden))
        return out

    calls = []
    real = Attention._attend_step
    monkeypatch.setattr(Attention, "_attend_step", lambda self, *a: calls.append(self.layer_index) or real(self, *a))
    model = _model()
    mtp_index = model.config.num_layers
    stepped = drafts(_Batch(model, "fp8"))
    assert mtp_index in calls
    monkeypatch.setattr(mtp_module, "paged_step_pools", lambda ctx: None)
    calls.clear()
    alone = drafts(_Batch(_model(), "fp8"))
    assert mtp_index not in calls
    for a, b in zip(stepped, alone):
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        assert float((a.double() - b.double()).abs().max() / b.double().abs().max()) < 1e-5


def test_mtp_draft_graph_equals_eager_step():
    """Draft rows through the MTP graph bucket (capture=False runs the graph's code eagerly through
    its static, padded buffers) give the eager fixed-shape step's logits bit for bit."""
    def drafts(m):
        # the backbone prompts do not matter here (the MTP block keeps its own state): one token each
        b, gen, out = _Batch(m, "fp8", prompts=(1,) * 5), torch.Generator().manual_seed(12), []
        width = m.config.hc_mult * m.config.hidden_size
        with torch.no_grad():
            for step in range(7):  # within the one window page each sequence holds
                lens = [1 + (i * step) % 2 for i in range(len(b.states))]
                pos = torch.cat([torch.arange(s.mtp.num_tokens, s.mtp.num_tokens + n) for s, n in zip(b.states, lens)])
                res = torch.randn(pos.numel(), width, generator=gen)
                ids = torch.randint(2, 500, (pos.numel(),), generator=gen)
                with set_forward_context(ForwardContext(lens, b.states)):
                    out.append(m.mtp[0].compute_logits(m.forward_mtp(res, ids, pos)[1]))
        return out

    graphed = _model()
    graphed.enable_cuda_graphs(max_batch=16, capture=False)
    got = drafts(graphed)
    rows = {a.shape[0] for a in got}
    sizes = {size for (_, size, _) in graphed._graphs._mtp_steps}
    assert sizes and sizes - rows, f"no padded MTP graph bucket was used (rows {rows}, buckets {sizes})"
    for a, b in zip(got, drafts(_model())):
        assert torch.equal(a, b)


def test_mtp_rejects_out_of_range_ids():
    m = _model()
    res = torch.randn(2, m.config.hc_mult * m.config.hidden_size)
    with pytest.raises(ValueError, match="next_token_ids out of range"):
        m.forward_mtp(res, torch.tensor([3, m.config.vocab_size]), torch.arange(2))


def test_fp8_pools_are_lossless_under_reference_numerics():
    """FP8 window/entries (e4m3 + E8M0 nope dims) and MXFP4 indexer keys store exactly the values the
    reference numerics already simulate: every logit equals the model-dtype pools' bit for bit."""
    plain = _Batch(_model(), "auto").decode(16, seed=4)
    fp8 = _Batch(_model(), "fp8").decode(16, seed=4)
    for a, b in zip(plain, fp8):
        assert torch.equal(a, b)


def test_step_derives_only_the_slots_asked_for():
    """`DecodeStep.derive` builds nothing up front; each accessor builds its own slots once (the kernel path
    never asks for the window's or the attended entries' gather tables). Values against a per-row
    re-derivation in Python ints: the window write slot (page of slot t mod ring) and a CSA layer's entry
    write slot (entry t // 4 on its page; unless t closes its window, the trash page at the row's own slot)."""
    b = _Batch(_model(), "fp8")
    pools = b.cache.pools
    states = [b.cache.reserve(seq, 1) for seq in b.seqs]  # pages for each sequence's next token
    step = pools.decode_step(len(states), 300)
    step.fill(states)
    step.derive()
    assert step._derived == {}
    page, off = step.kv_slot()
    assert set(step._derived) == {"window_write"}
    assert step.kv_slot()[0] is page  # built once per step
    epage, eoff = step.entry_slot(1, "main")  # layer 1: CSA, ratio 4
    assert set(step._derived) == {"window_write", ("compressed4", "write")}
    wps, cps = step.kinds["window"].page_size, step.kinds["compressed4"].page_size
    closing = 0
    for r, s in enumerate(states):
        t = s.num_tokens
        seq = b.seqs[r]
        slot = t % pools.ring
        assert (int(page[r]), int(off[r])) == (seq.block_tables["window"][slot // wps], slot % wps)
        i = t // 4
        closes = (t + 1) % 4 == 0
        want = (seq.block_tables["compressed4"][i // cps], i % cps) if closes else (pools.trash["compressed4"], r % cps)
        assert (int(epage[r]), int(eoff[r])) == want
        closing += (t + 1) % 4 == 0
    assert 0 < closing < len(states)  # both branches of the write slot are exercised
    step.derive()
    assert step._derived == {}  # the next step starts afresh


@pytest.mark.parametrize("mtp", [False, True])
def test_host_slots_equal_the_device_derivation(monkeypatch, mtp):
    """`paged_decode.HOST_SLOTS`: the slot arrays `fill` computes on the host (numpy) equal `_derive`'s device
    formulas for every key the kernels read -- window write, each raw-row ring's slots, each entry kind's write,
    entry positions and counts -- over steps whose positions cross window and page boundaries, with padding rows."""
    from dsv4.engine import paged_decode
    b = _Batch(_model(), "fp8")
    pools = b.cache.pools
    steps = {}
    for host in (True, False):
        monkeypatch.setattr(paged_decode, "HOST_SLOTS", host)
        steps[host] = pools.decode_step(len(b.seqs) + 3, 600)  # 3 padding rows
    assert steps[True]._slots and not steps[False]._slots
    rows_keys = [k[:4] for k in steps[True]._slots if k[0] == "rows" and k[-1] == 0]
    assert {k[1] for k in rows_keys} == {4, 128}
    seen_close = set()
    for _ in range(9):
        states = [b.cache.reserve(seq, 1) for seq in b.seqs]
        if mtp:
            states = [s for s in states if s.mtp is not None]
        for step in steps.values():
            step.fill(states, mtp=mtp)
            step.derive()
        host, dev = steps[True], steps[False]
        keys = ["window_write"] + [(k, "write") for k in host._entry_kinds()] + \
            [(what, r) for what in ("entry_pos", "count") for r in (4, 128)]
        for key in keys:
            got, want = host._get(key), dev._get(key)
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            assert all(torch.equal(g, w) for g, w in zip(got, want)), key
        for _, r, overlap, cap in rows_keys:
            got, want = host._rows_slots(r, overlap, cap), dev._rows_slots(r, overlap, cap)
            assert all(torch.equal(g, w) for g, w in zip(got, want)), (r, overlap, cap)
        t = host.pos[:len(states)]
        seen_close |= {r for r in (4, 128) if bool(((t + 1) % r == 0).any())}
        for seq, s in zip(b.seqs, states):  # move on as a decode step would
            for layer in (s.mtp,) if mtp else s.layers:
                layer.advance_decode(1)
    assert 4 in seen_close  # an entry write that is not the trash page was compared
