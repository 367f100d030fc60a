"""Short prefill forwards as piecewise CUDA graphs (dsv4.model.prefill_graphs) on the GPU, against the eager
kernel-mode forward of the embedded model: bit for bit at a bucket's exact size -- every position's logits, the MTP
target streams, and the decode steps that read the state the pieces' attention wrote -- also when a bucket's graphs
replay new inputs; at padded sizes (other GEMM shapes) within bf16 level."""
from __future__ import annotations

from pathlib import Path

import torch

import dsv4
from dsv4 import load_model
from dsv4.model import ForwardContext, set_forward_context
from dsv4.model.prefill_graphs import prefill_bucket_size, prefill_bucket_sizes

DEVICE = "cuda"


def _prefill_then_decode(model, prompt: torch.Tensor, steps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """(every prompt position's logits then each greedy decode step's, the prefill's MTP target streams)."""
    state = model.new_sequence_state()
    n = prompt.numel()
    with torch.no_grad():
        with set_forward_context(ForwardContext([n], [state])):
            logits = [model.compute_logits(model(prompt.to(DEVICE), torch.arange(n, device=DEVICE))).float()]
        streams = model.get_mtp_target_hidden_states().float().cpu()
        for i in range(steps):
            nxt = logits[-1][-1:].argmax(-1)
            with set_forward_context(ForwardContext([1], [state])):
                logits.append(model.compute_logits(model(nxt, torch.tensor([n + i], device=DEVICE))).float())
    return torch.cat(logits).cpu(), streams


def test_prefill_pieces_replay_the_eager_forward():
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    eager = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
    graphed = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
    graphed.enable_cuda_graphs(max_batch=8)
    gen = torch.Generator().manual_seed(60)
    sizes = prefill_bucket_sizes()
    for n in sizes + [64]:  # every bucket at its exact size; 64 again: the bucket's graphs replay new inputs
        prompt = torch.randint(2, 2048, (n,), generator=gen)
        (a, ra), (b, rb) = _prefill_then_decode(eager, prompt), _prefill_then_decode(graphed, prompt)
        assert torch.isfinite(a).all() and a.std() > 0
        assert torch.equal(a, b), f"{n} tokens: max |diff| {float((a - b).abs().max()):.3e}"
        assert torch.equal(ra, rb), n
    buckets = graphed._graphs._prefill
    assert sorted(buckets) == sizes
    assert all(b.graphs for b in buckets.values())  # captured, not run eagerly
    # one set of static buffers for all buckets (the first rows of the largest's)
    assert len({b.x[0].data_ptr() for b in buckets.values()}) == 1
    for n in (5, 100, 200):  # padded: other GEMM / MoE shapes than the unpadded eager forward
        prompt = torch.randint(2, 2048, (n,), generator=gen)
        (a, _), (b, _) = _prefill_then_decode(eager, prompt), _prefill_then_decode(graphed, prompt)
        rel = float((b.double() - a.double()).norm() / a.double().norm())
        agree = float((b.argmax(-1) == a.argmax(-1)).double().mean())
        print(f"{n} tokens padded to {prefill_bucket_size(n)}: rel {rel:.2e}, argmax agree {agree:.4f}")
        assert rel < 2e-2 and agree > 0.97, (n, rel, agree)


def _mtp_over(model, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    """One fresh sequence: a prompt of n tokens, then the MTP block over its rows and over a 16-token chunk that
    continues it (its window state): each call's logits and residual."""
    state, out = model.new_sequence_state(), []
    with torch.no_grad():
        for start, k in ((0, n), (n, 16)):
            ids = torch.randint(2, 2048, (k,), generator=gen).to(DEVICE)
            nxt = torch.randint(2, 2048, (k,), generator=gen).to(DEVICE)
            pos = torch.arange(start, start + k, device=DEVICE)
            with set_forward_context(ForwardContext([k], [state])):
                model(ids, pos)
                res, hidden = model.forward_mtp(model.get_mtp_target_hidden_states(), nxt, pos)
            out += [model.mtp[0].compute_logits(hidden).float().cpu(), res.float().cpu()]
    return out


def test_mtp_prefill_pieces_replay_its_eager_forward():
    """The MTP block over a prefill's rows (the speculator's catch-up after a prompt chunk) through its own pieces:
    its logits and residual bit for bit against its eager forward at every bucket's exact size, and over a chunk that
    continues its window state (exact bucket sizes: a padded one may pick other GEMM shapes)."""
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    eager = load_model(path, DEVICE, torch.bfloat16, kernels="triton", include_mtp=True)
    graphed = load_model(path, DEVICE, torch.bfloat16, kernels="triton", include_mtp=True)
    graphed.enable_cuda_graphs(max_batch=8)
    for n in prefill_bucket_sizes():
        want = _mtp_over(eager, n, torch.Generator().manual_seed(n))
        got = _mtp_over(graphed, n, torch.Generator().manual_seed(n))
        assert all(torch.isfinite(w).all() for w in want)
        for i, (a, b) in enumerate(zip(want, got)):
            assert torch.equal(a, b), (n, i, float((a - b).abs().max()))
    buckets = graphed._graphs._mtp_prefill
    assert sorted(buckets) == prefill_bucket_sizes() and all(b.graphs for b in buckets.values())


def test_engine_prefill_pieces_keep_the_greedy_text(monkeypatch):
    """The engine on its GPU defaults (graphs, FP8 cache) with and without the prefill pieces: the same greedy text up
    to a near tie (padded buckets may round differently), prompts of 1 to ≈ 60 tokens, prefilled together in one
    forward of fewer than PREFILL_MAX_TOKENS tokens (the engine's first step takes every waiting prompt: in session
    60 a first version's 300 tokens ran eagerly and the test failed on that)."""
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_engine_gpu import assert_same_greedy_text

    from dsv4 import LLM, SamplingParams
    from dsv4.model import prefill_graphs

    prompts = ["def fib(n):", "The", "import os\n" * 12, "class A:\n    def", "x = [" + "1, " * 30]  # one step, < 256
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    runs = {}
    for limit in (0, prefill_graphs.PREFILL_MAX_TOKENS):
        monkeypatch.setattr(prefill_graphs, "PREFILL_MAX_TOKENS", limit)
        llm = LLM(device=DEVICE)
        runs[limit] = llm.generate(prompts, params)
        assert bool(llm.engine.model._graphs._prefill) == bool(limit)
    for a, b in zip(*runs.values()):
        assert_same_greedy_text(b, a)


def test_serve_startup_captures_every_bucket():
    """`LLMEngine.capture_prefill_graphs` (`dsv4 serve` before its first request) captures every bucket once; prompts
    then run on those graphs and answer as an engine that captured each bucket at its first prompt (the same kernels
    on the same rows: the same tokens)."""
    from dsv4 import LLM, SamplingParams

    early = LLM(device=DEVICE)
    line = early.engine.capture_prefill_graphs()
    buckets = early.engine.model._graphs._prefill
    sizes = prefill_bucket_sizes()
    assert line.startswith(f"prefill graphs for {sizes[0]}-{sizes[-1]} tokens captured in"), line
    assert sorted(buckets) == sizes and all(b.graphs for b in buckets.values())
    assert early.engine.capture_prefill_graphs() == ""  # nothing left to capture
    prompts, params = ["def fib(n):", "import os\n" * 12], SamplingParams(temperature=0.0, max_tokens=16)
    lazy = LLM(device=DEVICE)
    want = [r.token_ids for r in lazy.generate(prompts, params)]
    assert [r.token_ids for r in early.generate(prompts, params)] == want


def test_a_bucket_that_does_not_fit_in_memory_runs_eagerly(caplog):
    """Real out-of-memory errors inside the captures: the process's GPU memory capped ROOM MiB above what it holds
    while serve's startup capture runs (largest bucket first), from a tight room (session 61, H100: 16 MiB, limit 16)
    up to one where everything fits (256 MiB). Each time the capture returns, the
    limit drops below the buckets that did not fit (a warning says so), and the forwards then equal the eager
    model's bit for bit -- above the limit eagerly, at the buckets that fit through their graphs."""
    from dsv4.model.prefill_graphs import PREFILL_MAX_TOKENS

    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    eager = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
    gen = torch.Generator().manual_seed(61)
    prompts = [torch.randint(2, 2048, (n,), generator=gen) for n in prefill_bucket_sizes()]  # (exact: no padding)
    want = [_prefill_then_decode(eager, p) for p in prompts]
    del eager
    limits = {}
    for room in (16, 32, 48, 64, 96, 128, 256):
        graphed = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
        graphed.enable_cuda_graphs(max_batch=8)
        _prefill_then_decode(graphed, prompts[0][:1])  # (the decode graphs' pool and kernels, before the cap)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + room * 2**20) / total)
        try:
            captured = graphed._graphs.capture_prefill()
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        limit = limits[room] = graphed._graphs.prefill_limit
        assert captured == prefill_bucket_sizes(limit), (room, captured, limit)
        for p, (a, ra) in zip(prompts, want):
            b, rb = _prefill_then_decode(graphed, p)
            assert torch.equal(a, b) and torch.equal(ra, rb), (room, limit, p.numel())
        del graphed
        if limit is None:
            break
    print(f"prefill limit by MiB of room: {limits}")
    assert limits[16] is not None and limits[16] < PREFILL_MAX_TOKENS
    assert "bucket did not fit in GPU memory (CUDA out of memory" in caplog.text
    assert list(limits.values())[-1] is None, limits  # (everything fits with the largest room: 256 MiB)
