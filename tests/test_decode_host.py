"""The host side of a decode step (docs: dsv4.engine.paged_decode, dsv4.model.context):

* `DecodeStep.fill` keeps a host image of the tables, rewrites only rows whose pages changed and ships
  it through two staging buffers in turn; over many steps (tables growing, sequences joining, leaving
  and changing order, pages freed and reallocated, a table edited in place, multi-token rows, MTP
  rows, a failed fill) the device buffers must equal a from-scratch computation every time;
* ids and positions are checked on the host when they are host tensors, and device tensors of a
  `trusted_inputs` context are never read back (`_OnGPU` stands in for a GPU tensor: a shape, a CUDA
  device, and any other use fails); out-of-range ids still raise a ValueError naming the tensor.
"""
from __future__ import annotations

import random

import pytest
import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.engine.cache import CacheConfig, HybridCache
from dsv4.engine.sequence import Sequence
from dsv4.model.context import ForwardContext, advance_paged, check_token_ids, sequence_spans
from dsv4.model.rope import MAX_POSITION


class _OnGPU:
    """Stands in for a GPU tensor on CPU-only machines: shape and device only, no values to read."""

    def __init__(self, n: int):
        self.shape, self.device = (n,), torch.device("cuda", 0)

    def numel(self) -> int:
        return self.shape[0]

    def __getattr__(self, name):
        raise AssertionError(f"read back a device tensor (Tensor.{name})")


def _expected(step, cfg, trash, states, lens, mtp):
    """From scratch: positions (padding 0), then per kind one row per token: the sequence's first
    `width` pages then the kind's trash page; kinds the step's layers do not use, and padding rows,
    all trash."""
    specs = [cfg.mtp_layer] if mtp else cfg.layers
    used = {"window"}
    for spec in specs:
        if spec.compress_ratio:
            used |= {f"compressed{spec.compress_ratio}", "state"}
            if spec.compress_ratio == 4:  # CSA layers carry the indexer
                used.add("indexer4")
    pos, seqs = [], []
    for s, n in zip(states, lens):
        t = (s.mtp if mtp else s).num_tokens
        pos += list(range(t, t + n))
        seqs += [s.layers[0].seq] * n
    pad = step.size - len(pos)
    out = {"pos": pos + [0] * pad}
    for name, w in step.widths.items():
        rows = []
        for seq in seqs + [None] * pad:
            pages = list(seq.block_tables.get(name, []))[:w] if seq is not None and name in used else []
            rows.append(pages + [trash[name]] * (w - len(pages)))
        out[name] = rows
    return out


def test_fill_over_many_steps_equals_fresh_tables():
    cfg = tiny_config("fp4", "sliding,csa,hca,csa")  # the MTP block is a sliding layer
    cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=8, max_model_len=1024),
                        dtype=torch.float32, device="cpu")
    pools, rnd = cache.pools, random.Random(3)
    seqs = [Sequence(f"r{i}", [1]) for i in range(6)]
    states = [cache.state_of(s) for s in seqs]
    for seq, st, n in zip(seqs, states, (3, 60, 250, 17, 130, 254)):  # near window / ratio-4 page edges
        cache.reserve(seq, n)
        advance_paged([st], [n])
        advance_paged([st], [n], mtp=True)
    cache.block_manager.allocate(seqs[2], 300)  # pages far ahead: more than the step's tables hold
    step = pools.decode_step(8, 512)
    assert len(seqs[2].block_tables["compressed4"]) > step.widths["compressed4"]
    staged = []
    for i in range(30):
        live = rnd.sample(range(6), rnd.randint(1, 6))  # joins, leaves, new order: rows change owner
        lens = [rnd.randint(1, 5) for _ in live]
        while sum(lens) > step.size:
            live.pop()
            lens.pop()
        if i in (13, 14):  # the same rows twice, for the in-place edit below
            live, lens = [5, 2, 4], [1, 1, 1]
        if i == 9:  # preemption-like: pages freed and reallocated (others, in another order)
            victim = seqs[live[0]]
            cache.block_manager.free(victim)
            cache.block_manager.allocate(Sequence("other", [1]), 40)
            victim.num_computed_tokens = 0
            cache.reserve(victim, states[live[0]].num_tokens)
        if i == 14:  # a table edited in place under a row that keeps its sequence: the held copy must notice
            table = seqs[live[0]].block_tables["window"]
            assert len(table) == 2
            table[0], table[-1] = table[-1], table[0]
        mtp = i % 3 == 2  # the same step object alternates backbone and MTP rows
        chosen = [states[j] for j in live]
        for j, n in zip(live, lens):  # pages (and backbone tokens) for the rows of this step
            extra = (states[j].mtp.num_tokens + n - seqs[j].num_computed_tokens) if mtp else n
            if extra > 0:
                cache.reserve(seqs[j], extra)
                if mtp:  # MTP rows never run ahead of the backbone
                    advance_paged([states[j]], [extra])
        want = _expected(step, cfg, pools.trash, chosen, lens, mtp)
        step.fill(chosen, lens, mtp=mtp)
        assert step.pos.tolist() == want["pos"], i
        for name in step.widths:
            assert step.tables[name].tolist() == want[name], (i, name)
        buf = step._staging[1 - step._turn][0]  # the staging buffer this fill used
        assert torch.equal(buf, step._dev)
        staged.append(buf.data_ptr())
        if i == 20:  # a failed fill (missing pages) leaves nothing half-done for the next one
            short = seqs[live[-1]]
            saved = short.block_tables["window"]
            short.block_tables["window"] = []
            with pytest.raises(RuntimeError, match=f"{short.request_id!r}: position .* window pages; 0 usable"):
                step.fill(chosen, lens, mtp=mtp)
            short.block_tables["window"] = saved
        advance_paged(chosen, lens, mtp=mtp)
    assert len(set(staged)) == 2 and all(a != b for a, b in zip(staged, staged[1:]))  # two buffers, in turn
    with pytest.raises(ValueError, match="9 tokens for a step of 8 rows"):
        step.fill(states[:3], [3, 3, 3])


def test_check_token_ids():
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1))
    check_token_ids(ids, 512, "input_ids")
    for bad in (512, -1, 10_000):
        wrong = ids.clone()
        wrong[17] = bad
        for trusted in (False, True):  # host ids are checked even when trusted: it costs nothing
            with pytest.raises(ValueError, match=rf"input_ids out of range \[0, 512\): found {bad}"):
                check_token_ids(wrong, 512, "input_ids", trusted)
    check_token_ids(torch.empty(0, dtype=torch.long), 512, "input_ids")
    check_token_ids(_OnGPU(5), 512, "input_ids", trusted=True)  # the engine's own ids: not read back


def test_sequence_spans_matches_brute_force():
    """Ragged batches (empty sequences too): spans, acceptance of the right positions, and a named
    error for any single wrong position -- checked against a plain per-token loop."""
    rnd = random.Random(7)
    for _ in range(200):
        n = rnd.randint(1, 6)
        lens = [rnd.choice([0, 1, 1, 2, 5, 9]) for _ in range(n)]
        done = [rnd.randrange(0, 3000) for _ in range(n)]
        ctx = ForwardContext(lens, [object() for _ in range(n)])
        pos = [d + j for d, k in zip(done, lens) for j in range(k)]
        starts = [sum(lens[:i]) for i in range(n)]
        assert sequence_spans(ctx, torch.tensor(pos, dtype=torch.long), done) == list(zip(starts, lens))
        if pos:
            k = rnd.randrange(len(pos))
            owner = max(i for i in range(n) if starts[i] <= k and lens[i])
            wrong = list(pos)
            wrong[k] += rnd.choice([-1, 1, 7])
            with pytest.raises(ValueError, match=f"sequence {owner}: positions"):
                sequence_spans(ctx, torch.tensor(wrong, dtype=torch.int32), done)


def test_trusted_context_reads_no_device_positions():
    ctx = ForwardContext([2, 1], [object(), object()], trusted_inputs=True)
    gpu = _OnGPU(3)
    assert sequence_spans(ctx, gpu, [5, 9]) == [(0, 2), (2, 1)]
    with pytest.raises(ValueError, match="must continue its state"):  # host positions: still checked
        sequence_spans(ctx, torch.tensor([5, 6, 8]), [5, 9])
    with pytest.raises(ValueError, match="2\\^24"):  # the limit comes from the host-side lengths
        sequence_spans(ctx, gpu, [MAX_POSITION - 1, 9])
    with pytest.raises(ValueError, match="sums to 3"):
        sequence_spans(ctx, _OnGPU(4), [5, 9])
    untrusted = ForwardContext([2, 1], ctx.states)
    with pytest.raises(AssertionError, match="read back"):  # without the promise they are read back
        sequence_spans(untrusted, gpu, [5, 9])


def test_forward_rejects_out_of_range_ids_trusted_or_not():
    from dsv4.model import DeepseekV4ForCausalLM, set_forward_context
    m = DeepseekV4ForCausalLM(tiny_config("fp4", "sliding"), torch.float32)
    m.load_random_weights(2)
    vocab = m.config.vocab_size
    for trusted in (False, True):
        st = m.new_sequence_state()
        with torch.no_grad(), set_forward_context(ForwardContext([3], [st], trusted_inputs=trusted)):
            with pytest.raises(ValueError, match=f"input_ids out of range.*found {vocab}"):
                m(torch.tensor([4, vocab, 7]), torch.arange(3))
        assert st.num_tokens == 0  # nothing half-done
    st = m.new_sequence_state()
    with torch.no_grad(), set_forward_context(ForwardContext([3], [st], trusted_inputs=True)):
        m(torch.tensor([4, vocab - 1, 0]), torch.arange(3))
    assert st.num_tokens == 3
