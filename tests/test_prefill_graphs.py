"""Short prefill forwards as piecewise graphs (dsv4.model.prefill_graphs): the plumbing, run eagerly on the CPU
(`capture=False`), must give the plain forward's results exactly -- padded buckets, mixes of chunks and decode rows,
chunks that continue a state, the decode steps after them; GPU capture: tests/gpu/test_prefill_pieces_gpu.py."""
from __future__ import annotations

import pytest
import torch

from dsv4.checkpoint.writer import tiny_config
from dsv4.model import DeepseekV4ForCausalLM, ForwardContext, prefill_graphs, set_forward_context

# (tokens per sequence) of each forward, over three sequences: fresh chunks (a bucket's exact size, padded ones),
# chunks continuing a state past the window (8) and a compressor's 4-token ratio, a mix with one-token rows, batches
# with a sequence that brings no token (one token from each of the others: the eager batched decode attention)
FORWARDS = [(16,), (10, 7, 5), (3, 1, 1), (33, 2, 4), (1,), (1, 1, 1), (40, 1, 1), (0, 6, 2), (0, 1, 1)]


def _model(seed: int):
    cfg = tiny_config("fp4", "sliding,csa,hca", num_hash_layers=1, sliding_window=8)
    m = DeepseekV4ForCausalLM(cfg, torch.float32)
    m.load_random_weights(seed)
    return m


def _run(pieces: bool, forwards=FORWARDS, seed: int = 5, mtp: bool = False):
    """Each forward's logits and MTP target streams (with `mtp`, then the MTP block over the same rows: its residual
    and logits), and the model."""
    m = _model(seed)
    if pieces:
        m.enable_cuda_graphs(max_batch=2, capture=False)
    states = [m.new_sequence_state() for _ in range(3)]
    gen = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for lens in forwards:
            ids = torch.randint(2, 500, (sum(lens),), generator=gen)
            pos = torch.cat([torch.arange(s.num_tokens, s.num_tokens + n) for s, n in zip(states, lens)])
            with set_forward_context(ForwardContext(list(lens), states[:len(lens)])):
                hidden = m(ids, pos)
            out.append((m.compute_logits(hidden), m.get_mtp_target_hidden_states()))
            if mtp:
                nxt = torch.randint(2, 500, (sum(lens),), generator=gen)
                with set_forward_context(ForwardContext(list(lens), states[:len(lens)])):
                    res, hidden = m.forward_mtp(out[-1][1], nxt, pos)
                out.append((m.compute_logits(hidden), res))
    return out, m


def test_prefill_pieces_equal_the_plain_forward():
    plain, _ = _run(False)
    pieces, m = _run(True)
    for i, ((a, ra), (b, rb)) in enumerate(zip(plain, pieces)):
        assert torch.isfinite(a).all() and a.std() > 0
        assert torch.equal(a, b), (i, FORWARDS[i], float((a - b).abs().max()))
        assert torch.equal(ra, rb), (i, FORWARDS[i])
    g = m._graphs
    assert sorted(g._prefill) == [16, 32, 64]  # 16 (exact; 5 padded), 22 -> 32, 39 and 42 -> 64
    # (1,): the decode pieces; (1, 1, 1): one token of each of 3 sequences, above max_batch 2, is left to the eager
    # forward's batched decode attention (never prefill pieces)
    assert list(g._buckets) == [1]
    assert all(b.x[-1] is b.streams for b in g._prefill.values())


def test_mtp_prefill_pieces_equal_its_plain_forward():
    """The MTP block over a forward's rows (the speculator's catch-up) through its own pieces: its residual and
    logits equal its plain forward's, for every forward the model's pieces take (and the others, which stay eager),
    chunks continuing its window state included; its buckets share the model's static buffers."""
    plain, _ = _run(False, mtp=True)
    pieces, m = _run(True, mtp=True)
    for i, ((a, ra), (b, rb)) in enumerate(zip(plain, pieces)):
        assert torch.isfinite(a).all() and a.std() > 0
        assert torch.equal(a, b) and torch.equal(ra, rb), (i // 2, FORWARDS[i // 2], "mtp" if i % 2 else "model")
    g = m._graphs
    # (1,): one token of one sequence is a short prefill for the MTP block (its decode pieces are the model's only)
    assert sorted(g._mtp_prefill) == [16, 32, 64] and sorted(g._prefill) == [16, 32, 64]
    assert g._mtp_prefill[16].x[0].data_ptr() == g._prefill[16].x[0].data_ptr()


def test_static_buffers_do_not_grow_with_depth():
    """What crosses from one piece to the next lives in buffers shared by the layers of one parity; what only the
    attention in between reads (q), in one buffer for all; and the buckets share them (the first rows of the largest
    bucket's): their memory is one bucket's, whatever the depth or the number of buckets."""
    _, m = _run(True, forwards=[(16,), (20,), (3,)])
    g = m._graphs
    bucket, other = g._prefill[16], g._prefill[32]
    layers = len(m.layers)
    assert layers == 3
    assert not bucket._static and not other._static  # (every static tensor has a row per token)
    arena = g.prefill_arena
    top = max(prefill_graphs.prefill_bucket_sizes())
    assert arena.capacity == top == prefill_graphs.PREFILL_MAX_TOKENS
    assert {key[0] for key in arena._bufs} == {0, 1}
    assert all(b.shape[0] == top for b in arena._bufs.values())
    assert bucket.x[0].data_ptr() == other.x[0].data_ptr() and bucket.x[0].shape[0] == 16 and other.x[0].shape[0] == 32
    assert bucket.attended.data_ptr() == other.attended.data_ptr()
    assert bucket.x[0].data_ptr() == bucket.x[2].data_ptr() != bucket.x[1].data_ptr()
    assert bucket.pre[0].cos.data_ptr() == bucket.pre[2].cos.data_ptr() != bucket.pre[1].cos.data_ptr()
    assert bucket.pre[0].q.data_ptr() == bucket.pre[1].q.data_ptr() == bucket.pre[2].q.data_ptr()  # attention only


@pytest.mark.parametrize("limit, tokens, bucket, made", [
    (0, 16, None, []), (16, 16, 16, [16]), (15, 16, None, [16]), (100, 100, 128, [16, 32, 64, 128]),
    (300, 300, None, [16, 32, 64, 128, 256])])  # 300: no bucket above the largest, the eager forward
def test_bucket_choice(monkeypatch, limit, tokens, bucket, made):
    monkeypatch.setattr(prefill_graphs, "PREFILL_BUCKETS", (16, 32, 64, 128, 256))
    monkeypatch.setattr(prefill_graphs, "PREFILL_MAX_TOKENS", limit)
    assert prefill_graphs.prefill_bucket_size(tokens) == bucket
    assert prefill_graphs.prefill_bucket_size(0) is None
    # every bucket a forward may take (what serve captures ahead): the one that holds the limit included
    assert prefill_graphs.prefill_bucket_sizes() == made


def test_forwards_above_the_limit_run_eagerly(monkeypatch):
    monkeypatch.setattr(prefill_graphs, "PREFILL_MAX_TOKENS", 32)
    _, m = _run(True, forwards=[(33,), (2, 30), (1, 32)])  # 33, 32, 33 tokens
    assert sorted(m._graphs._prefill) == [32]


def test_engine_text_with_prefill_pieces():
    """The engine's prefill steps (prompts, chunks, mixed with decode rows) through the pieces: greedy text identical,
    MTP speculation included (its prefill reads the pieces' MTP target streams)."""
    from dsv4 import LLM, SamplingParams

    prompts = ["def main():", "The", "import os\nimport sys\n" * 3, "class A:\n    def"]
    params = SamplingParams(temperature=0.0, max_tokens=16)
    for spec in ({}, dict(speculative="mtp", num_draft_tokens=2)):
        llm = LLM(**spec)
        plain = [r.token_ids for r in llm.generate(prompts, params)]
        llm.engine.model.enable_cuda_graphs(max_batch=4, capture=False)
        pieces = [r.token_ids for r in llm.generate(prompts, params)]
        assert pieces == plain, spec
        assert llm.engine.model._graphs._prefill
        assert bool(llm.engine.model._graphs._mtp_prefill) == bool(spec)  # the MTP block's catch-up as pieces


def test_which_forwards_take_the_pieces():
    """One token from each of several sequences is the attention's batched decode path (it leaves the inverse RoPE to
    `finish`, which a captured piece cannot decide per call): never pieces, also with sequences bringing no token."""
    m = _model(7)
    m.enable_cuda_graphs(max_batch=2, capture=False)
    g = m._graphs
    top = prefill_graphs.PREFILL_MAX_TOKENS
    assert [g.handles_prefill(lens) for lens in ([2], [1], [0, 6, 2], [3, 1, 1], [top], [top - 56, 56])] == [True] * 6
    assert not any(g.handles_prefill(lens) for lens in ([1, 1], [0, 1, 1], [1, 0, 1, 1], [top + 1], [0], []))


def test_all_buckets_made_ahead(monkeypatch):
    """`capture_prefill` (serve's startup) makes every bucket up to the limit before any forward; uncaptured here, so it
    reports none captured, and the forwards then use those buckets with the plain forward's results."""
    from dsv4 import LLM

    monkeypatch.setattr(prefill_graphs, "PREFILL_MAX_TOKENS", 64)
    plain, _ = _run(False, forwards=FORWARDS[:4])
    m = _model(5)
    m.enable_cuda_graphs(max_batch=2, capture=False)
    assert m._graphs.capture_prefill() == [] and sorted(m._graphs._prefill) == [16, 32, 64]
    made = dict(m._graphs._prefill)
    states = [m.new_sequence_state() for _ in range(3)]
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for (want, _), lens in zip(plain, FORWARDS[:4]):
            ids = torch.randint(2, 500, (sum(lens),), generator=gen)
            pos = torch.cat([torch.arange(s.num_tokens, s.num_tokens + n) for s, n in zip(states, lens)])
            with set_forward_context(ForwardContext(list(lens), states[:len(lens)])):
                assert torch.equal(m.compute_logits(m(ids, pos)), want)
    assert m._graphs._prefill == made  # the same bucket objects served the forwards
    engine = LLM().engine
    assert engine.capture_prefill_graphs() == ""  # graphs off (the CPU's default): serve prints no line
    engine.model.enable_cuda_graphs(max_batch=4, capture=False)
    assert engine.capture_prefill_graphs() == ""  # nothing captured off CUDA
    assert ", CUDA graphs on, prefills of up to 64 tokens piecewise, overlap off" in engine.describe()


def test_a_bucket_out_of_gpu_memory_runs_eagerly(monkeypatch, caplog):
    """A bucket whose capture runs out of GPU memory (simulated: the 64-token bucket and up) leaves the forward to the
    eager path with the plain forward's results; every bucket and the static buffers go, the limit drops a bucket,
    and the buckets below are made again with buffers for the new largest. serve's `capture_prefill` ahead (the
    largest bucket first) stops below the largest bucket that does not fit, and the startup line says so."""
    from dsv4.model import piecewise

    real = piecewise.PiecewiseBucket.ensure_captured

    def ensure_captured(bucket):
        if bucket.size >= 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(bucket)

    monkeypatch.setattr(piecewise.PiecewiseBucket, "ensure_captured", ensure_captured)
    plain, _ = _run(False)
    pieces, m = _run(True)  # FORWARDS[3]: 39 tokens, the 64-token bucket
    for i, ((a, ra), (b, rb)) in enumerate(zip(plain, pieces)):
        assert torch.equal(a, b) and torch.equal(ra, rb), (i, FORWARDS[i])
    g = m._graphs
    # the first failure (39 tokens) was of buffers sized for 2048 rows: the limit drops a bucket, to 1024; the next
    # (42 tokens, buffers for 1024 rows) to 512; the 8-token forward after it makes the 16 bucket again
    assert g.prefill_limit == 512 and sorted(g._prefill) == [16] and g.prefill_arena.capacity == 512
    assert "the 64-token bucket did not fit in GPU memory (CUDA out of memory. Tried to allocate 2.00 GiB)" in caplog.text
    assert not g.handles_prefill([513]) and g.handles_prefill([512])

    m = _model(5)
    m.enable_cuda_graphs(max_batch=2, capture=False)
    # (uncaptured on the CPU; the largest first: 2048, 1024 ... 64 fail; with the MTP block's buckets beside)
    assert m._graphs.capture_prefill(mtp=True) == []
    assert m._graphs.prefill_limit == 32 and sorted(m._graphs._prefill) == sorted(m._graphs._mtp_prefill) == [16, 32]
    assert m._graphs.prefill_arena.capacity == 32
    from dsv4 import LLM
    engine = LLM().engine
    engine.model.enable_cuda_graphs(max_batch=4, capture=False)
    engine.model._graphs.capture_prefill()
    assert "prefills of up to 32 tokens piecewise" in engine.describe()  # (serve's startup line: the lowered limit)


@pytest.mark.parametrize("tokens", [0, 16, 100])
def test_engine_prefill_graph_tokens(tokens):
    """EngineConfig.prefill_graph_tokens (--prefill-graph-tokens) caps the forwards that take the pieces (none for 0),
    serve's line names it, and the tokens equal the engine's without graphs."""
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(tokens)
    prompts = [torch.randint(2, 500, (n,), generator=gen).tolist() for n in (5, 30, 90)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    out = {}
    for graphs in (False, True):
        m = _model(11)
        if graphs:
            m.enable_cuda_graphs(max_batch=4, capture=False)
        engine = LLMEngine(m, m.config, None, EngineConfig(max_num_seqs=4, max_num_batched_tokens=64,
                                                           max_model_len=256, prefill_graph_tokens=tokens))
        for i, ids in enumerate(prompts):
            engine.add_request(str(i), ids, params)
        got: dict[str, list[int]] = {}
        while engine.has_unfinished():
            for o in engine.step():
                got.setdefault(o.request_id, []).extend(o.token_ids)
        out[graphs] = got
    assert out[True] == out[False] and all(len(t) == 6 for t in out[True].values())
    g = m._graphs
    assert g.prefill_limit == tokens
    # (the prefill steps bring 64 and 63 tokens: the 64 bucket under a limit of 100, eager under 16)
    assert set(g._prefill) <= set(prefill_graphs.prefill_bucket_sizes(tokens))
    assert sorted(g._prefill) == ([64] if tokens >= 64 else [])
    piecewise = f", prefills of up to {tokens} tokens piecewise" if tokens else ""
    assert f"CUDA graphs on{piecewise}, overlap off" in engine.describe()


@pytest.mark.parametrize("bad", [-1, 2049, True, 1.5])
def test_prefill_graph_tokens_checked(bad):
    from dsv4.cli import main
    from dsv4.engine.llm_engine import EngineConfig

    with pytest.raises(ValueError, match="EngineConfig.prefill_graph_tokens"):
        EngineConfig(prefill_graph_tokens=bad)
    assert main(["serve", "--prefill-graph-tokens", str(bad)]) == 2  # argparse's usage error, before any load
