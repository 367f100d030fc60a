"""GPU end-to-end (issue #6 item 6): the bf16 model with Triton kernels (FP8 linears and fused MoE on
weights kept quantised) against the CPU float32 reference model loaded from the same checkpoint.

Tolerance. On these random models FP8 activation quantisation amplifies any perturbation: an
element moving by one bf16 ulp flips its e4m3 rounding (a 6 % step) with a few % probability at every
FP8 linear, and 4 layers of that decorrelate the logits. Measured (H200, 2026-11-30, prefill of 200):
CPU bf16 vs CPU fp32 0.23-0.27 relative RMS; GPU-kernels vs CPU bf16 (same rounding points, only GEMM
summation order differs) 0.21-0.27 — the same size; with numerics="transformers" (no FP8
simulation) CPU bf16 vs fp32 is 1.3e-2. So the issue's fixed criterion (relative RMS < 2e-2, top-1
>= 95 %) cannot hold for *any* bf16 model here; it is printed, not asserted. Asserted instead: the GPU
kernel path is statistically as close to the fp32 reference as the CPU bf16 model — relative RMS
<= 1.5x the CPU bf16 model's + 2e-2 — and picks the reference's top-1 token wherever the reference is
confident: its top-1 logit leads the second by more than 3x the CPU bf16 model's logit noise (RMS
difference to fp32 at that position); prefill and decode positions pooled, at least 20 of them, >= 85 %
agreement (H200, s10h: 48-66 confident positions, 0.90-1.00 agreement; a broken kernel is near chance,
1/512). Top-1 agreement over all positions is noise here: an exact MoE moved fp4-tiny's decode from 0.64
to 0.58 while its relative RMS improved (s10f/s10g). A kernel indexing or
scaling bug gives O(1) errors (and top-1 near chance) and fails this. Decode is teacher-forced with
the fp32 model's greedy tokens so every model sees the same inputs at every step.
"""

from __future__ import annotations

import pytest
import torch

from dsv4 import load_model
from dsv4.checkpoint.writer import PRO_LAYERS, PRO_SHAPE, random_master_weights, tiny_config, write_checkpoint
from dsv4.model import ForwardContext, set_forward_context

PREFILL, DECODE = 200, 64
MAX_REL_RMS, MIN_TOP1 = 2e-2, 0.95
DEVICE = "cuda"

CONFIGS = {  # name: (layers, config overrides)
    "tiny": ("sliding,csa,hca,csa", dict()),
    "mid": ("sliding,csa,hca,csa", dict(hidden_size=1024, num_attention_heads=8, n_routed_experts=16,
                                        moe_intermediate_size=512)),
    "pro": (PRO_LAYERS, PRO_SHAPE),  # V4-Pro's shape (dsv4.checkpoint.writer)
}


def _ids(vocab: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _step(model, state, ids: torch.Tensor, start: int) -> torch.Tensor:
    dev = model.embed.weight.device
    n = ids.numel()
    with torch.no_grad(), set_forward_context(ForwardContext([n], [state])):
        h = model(ids.to(dev), torch.arange(start, start + n, device=dev))
        return model.compute_logits(h).float().cpu()


def _run(model, prompt: torch.Tensor, forced: list[int] | None, steps: int) -> tuple[torch.Tensor, list[int]]:
    """Prefill + `steps` decode steps; feeds `forced` tokens if given, else its own greedy picks."""
    state = model.new_sequence_state()
    logits = [_step(model, state, prompt, 0)]
    tokens = []
    for i in range(steps):
        tok = forced[i] if forced is not None else int(logits[-1][-1].argmax())
        tokens.append(tok)
        logits.append(_step(model, state, torch.tensor([tok]), prompt.numel() + i))
    return torch.cat(logits), tokens


def _confident_top1(out: torch.Tensor, ref: torch.Tensor, noisy: torch.Tensor) -> tuple[int, float]:
    """(positions where ref's top-1 leads by > 3x noisy's logit RMS error, out's top-1 agreement on them)."""
    top2 = ref.double().topk(2, dim=-1).values
    noise = (noisy.double() - ref.double()).pow(2).mean(-1).sqrt()
    conf = top2[:, 0] - top2[:, 1] > 3 * noise
    agree = out.argmax(-1) == ref.argmax(-1)
    return int(conf.sum()), float(agree[conf].double().mean()) if conf.any() else 0.0


def _compare(gpu: torch.Tensor, cpu: torch.Tensor) -> tuple[float, float]:
    g, c = gpu.double(), cpu.double()
    rel = float((g - c).norm() / c.norm())
    top1 = float((g.argmax(-1) == c.argmax(-1)).double().mean())
    return rel, top1


@pytest.mark.parametrize("size", list(CONFIGS))
@pytest.mark.parametrize("expert_dtype", ["fp4", "fp8"])
def test_logits_match_cpu_reference(tmp_path, size, expert_dtype):
    layers, overrides = CONFIGS[size]
    cfg = tiny_config(expert_dtype, layers, **overrides)
    path = write_checkpoint(tmp_path / size, cfg, random_master_weights(cfg, seed=5))
    cpu = load_model(path, "cpu", torch.float32, kernels="torch")
    gpu = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
    assert gpu.kernels == "triton" and gpu.layers[1].ffn.packed is not None
    assert gpu.layers[1].attn.wq_a.weight.dtype == torch.float8_e4m3fn  # kept quantised
    prompt = _ids(cfg.vocab_size, PREFILL, seed=11)
    ref, tokens = _run(cpu, prompt, None, DECODE)
    out, _ = _run(gpu, prompt, tokens, DECODE)
    del gpu
    cpu_bf16 = load_model(path, "cpu", torch.bfloat16, kernels="torch")
    base, _ = _run(cpu_bf16, prompt, tokens, DECODE)
    assert torch.isfinite(out).all()
    rows = []
    for part, sl in (("prefill", slice(0, PREFILL)), ("decode", slice(PREFILL, None))):
        rel, top1 = _compare(out[sl], ref[sl])
        rel_b, top1_b = _compare(base[sl], ref[sl])
        rel_kb, top1_kb = _compare(out[sl], base[sl])
        met = "met" if rel < MAX_REL_RMS and top1 >= MIN_TOP1 else "NOT met"
        print(f"\n[e2e {size}/{expert_dtype} {part}] gpu-triton vs cpu-fp32: rel {rel:.2e} top1 {top1:.3f} | "
              f"cpu-bf16 vs cpu-fp32: rel {rel_b:.2e} top1 {top1_b:.3f} | gpu-triton vs cpu-bf16: rel "
              f"{rel_kb:.2e} top1 {top1_kb:.3f} | fixed criterion {met}")
        rows.append((part, rel, rel_b))
    for part, rel, rel_b in rows:
        assert rel <= 1.5 * rel_b + 2e-2, f"{part}: rel RMS {rel:.3e} vs cpu-bf16's {rel_b:.3e}"
    n_conf, top1_conf = _confident_top1(out, ref, base)
    print(f"[e2e {size}/{expert_dtype}] {n_conf} confident positions, gpu-triton top-1 on them {top1_conf:.3f}")
    assert n_conf >= 20, f"only {n_conf} confident positions"
    assert top1_conf >= 0.85, f"top-1 agreement {top1_conf:.3f} on {n_conf} confident positions"


def test_triton_kernels_refuse_non_bf16(tmp_path):
    cfg = tiny_config("fp4", "sliding")
    path = write_checkpoint(tmp_path / "c", cfg, random_master_weights(cfg, seed=1))
    with pytest.raises(ValueError, match="kernels='triton'"):
        load_model(path, DEVICE, torch.float32, kernels="triton")


def test_embedded_model_greedy_text_matches_cpu():
    from pathlib import Path

    import dsv4
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    cpu = load_model(path, "cpu", torch.float32, kernels="torch")
    gpu = load_model(path, DEVICE, torch.bfloat16, kernels="auto")
    assert gpu.kernels == "triton"
    prompt = torch.cat([torch.tensor([cpu.config.bos_token_id]), _ids(cpu.config.vocab_size, 40, seed=3)])
    ref_logits, ref_tokens = _run(cpu, prompt, None, 32)
    _, gpu_tokens = _run(gpu, prompt, None, 32)
    _, bf16_tokens = _run(load_model(path, "cpu", torch.bfloat16, kernels="torch"), prompt, None, 32)
    print(f"\n[e2e embedded] gpu-triton {gpu_tokens}\n[e2e embedded] cpu-fp32   {ref_tokens}"
          f"\n[e2e embedded] cpu-bf16   {bf16_tokens}")
    assert gpu_tokens == bf16_tokens, "greedy tokens differ from the CPU bf16 model (same rounding points)"
    first = next((i for i, (a, b) in enumerate(zip(ref_tokens, gpu_tokens)) if a != b), None)
    if first is not None:
        # Allowed only at a near-tie of the fp32 model: top-2 gap below one bf16 ulp of the logits
        # (2^-8 of the row's largest magnitude); printed so that it is reported, not hidden.
        row = ref_logits[prompt.numel() - 1 + first]
        gap = float(row.topk(2).values.diff().abs())
        ulp = 2.0 ** -8 * float(row.abs().max())
        print(f"[e2e embedded] NEAR-TIE: vs cpu-fp32 diverges at step {first} ({ref_tokens[first]} vs "
              f"{gpu_tokens[first]}), fp32 top-2 gap {gap:.3e} < bf16 ulp {ulp:.3e}: {gap < ulp}")
        assert gap < ulp, f"greedy tokens vs cpu-fp32 diverge at step {first} without a near-tie (gap {gap:.3e})"


def _batch_decode(model, prompts, steps: int):
    """Prefill each prompt alone, then `steps` greedy steps of the whole batch; logits per step."""
    dev = model.embed.weight.device
    states = [model.new_sequence_state() for _ in prompts]
    nxt = []
    with torch.no_grad():
        for st, p in zip(states, prompts):
            with set_forward_context(ForwardContext([p.numel()], [st])):
                nxt.append(int(model.compute_logits(model(p.to(dev), torch.arange(p.numel(), device=dev))[-1:]).argmax()))
        out = []
        for _ in range(steps):
            ids = torch.tensor(nxt, device=dev)
            pos = torch.tensor([s.num_tokens for s in states], device=dev)
            with set_forward_context(ForwardContext([1] * len(states), states)):
                logits = model.compute_logits(model(ids, pos)).float().cpu()
            out.append(logits)
            nxt = logits.argmax(-1).tolist()
    return torch.stack(out)


@pytest.mark.parametrize("batch", [1, 3, 4])
def test_cuda_graph_decode_matches_eager(batch, eager_prefill):
    """Piecewise CUDA graphs (dsv4.model.graphs) replay the eager kernel-mode decode: bit-identical
    at a bucket's exact size (1, 4); a padded batch (3 -> bucket 4) keeps the greedy tokens."""
    from pathlib import Path

    import dsv4
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    prompts = [_ids(2048, n, seed=n) for n in (37, 5, 130, 64)[:batch]]
    eager = _batch_decode(load_model(path, DEVICE, torch.bfloat16, kernels="triton"), prompts, 24)
    model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
    model.enable_cuda_graphs(max_batch=8)
    graphed = _batch_decode(model, prompts, 24)
    assert len(model._graphs._buckets) == 1 and model._graphs._buckets[{1: 1, 3: 4, 4: 4}[batch]].graphs
    assert torch.equal(graphed.argmax(-1), eager.argmax(-1))
    if batch in (1, 4):
        assert torch.equal(graphed, eager)
    else:
        rel = float((graphed.double() - eager.double()).norm() / eager.double().norm())
        assert rel < 1e-2, rel


def test_llm_with_cuda_graphs_generates_the_same_text(eager_prefill):
    from dsv4 import LLM, SamplingParams

    prompts = ["def main():", "The", "import os\nimport sys\n", "class A:\n    def", "x = [", "# a"]
    params = SamplingParams(temperature=0.0, max_tokens=32)
    # (eager and graphed asked for: since session 59 graphs and the FP8 cache are the GPU's defaults)
    plain = [r.token_ids for r in LLM(device=DEVICE, cuda_graphs=False, kv_dtype="auto").generate(prompts, params)]
    graphed = [r.token_ids for r in LLM(device=DEVICE, cuda_graphs=True, kv_dtype="auto").generate(prompts, params)]
    assert graphed == plain


def test_engine_overlap_on_the_gpu_matches_without():
    """The engine's look-ahead (next batch launched before the ids are read back, CUDA graphs) gives the same
    tokens as without it: requests that end by length only, so every batch is the same with and without."""
    from pathlib import Path

    import dsv4
    from dsv4.engine.llm_engine import EngineConfig, LLMEngine
    from dsv4.engine.sampling_params import SamplingParams

    def run(overlap: bool) -> tuple[dict, int]:
        engine = LLMEngine.from_pretrained(Path(dsv4.__file__).parent / "assets" / "tiny", device=DEVICE,
                                           engine_config=EngineConfig(max_num_seqs=8, overlap=overlap),
                                           cuda_graphs=True)
        launched = []
        inner = engine.scheduler.schedule_continuation
        engine.scheduler.schedule_continuation = lambda rows: launched.append(inner(rows)) or launched[-1]
        for i, n in enumerate((5, 37, 64, 130, 9, 200)):
            params = (SamplingParams(temperature=0.0, max_tokens=20 + 3 * i, ignore_eos=True) if i % 3
                      else SamplingParams(temperature=0.8, seed=i, max_tokens=24, ignore_eos=True))
            engine.add_request(f"r{i}", _ids(2048, n, seed=40 + i).tolist(), params)
        out: dict = {}
        while engine.has_unfinished():
            for o in engine.step():
                out.setdefault(o.request_id, []).extend(o.token_ids)
        return out, sum(b is not None for b in launched)

    plain, none = run(False)
    ahead, launched = run(True)
    assert none == 0 and launched >= 15
    assert ahead == plain


def test_paged_fp8_decode_kernels_graphs_and_torch_attention_agree(eager_prefill):
    """Paged FP8 decode steps (dsv4.engine.paged_decode) on the embedded model: the Triton
    decode-attention kernel eagerly and under one whole-step CUDA graph give the same greedy text;
    teacher-forced logits of the kernel and of the torch gather path over the same FP8 pools agree to
    bf16 level (the kernel's online softmax rounds P differently, so long greedy runs may part at a
    near-tie)."""
    import sys
    from pathlib import Path

    import dsv4
    from dsv4 import LLM, SamplingParams
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from paged_driver import PagedBatch

    prompts = ["def main():", "The", "import os\nimport sys\n", "class A:\n    def", "x = ["]
    params = SamplingParams(temperature=0.0, max_tokens=48)
    kernel = LLM(device=DEVICE, kv_dtype="fp8", cuda_graphs=False)
    assert all(b.attn.use_kernels for b in kernel.engine.model.layers)
    eager = [r.token_ids for r in kernel.generate(prompts, params)]
    graphed = LLM(device=DEVICE, kv_dtype="fp8", cuda_graphs=True)
    assert [r.token_ids for r in graphed.generate(prompts, params)] == eager
    assert graphed.engine.model._graphs._steps  # whole-step graphs were captured

    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    runs = []
    for use_kernel in (True, False):
        model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
        for b in model.layers:  # attention glue, cache stores and decode attention: kernels or torch
            b.attn.use_kernels = use_kernel
            if b.attn.indexer:
                b.attn.indexer.use_kernels = use_kernel
        runs.append(torch.cat(PagedBatch(model, "fp8").decode(40)))
    k, t = runs
    rel = float((k.double() - t.double()).norm() / t.double().norm())
    agree = float((k.argmax(-1) == t.argmax(-1)).double().mean())
    print(f"paged FP8 decode, kernel vs torch attention: rel {rel:.2e}, argmax agreement {agree:.4f}")
    assert rel < 2e-2 and agree > 0.97, (rel, agree)


@pytest.mark.parametrize("branches", [("shared_expert",), ("projections",), ("shared_expert", "projections")])
def test_side_stream_branches_are_bit_identical(monkeypatch, branches, eager_prefill):
    """Branches on the side stream (dsv4.model.side_stream, up to MAX_ROWS tokens: the decode steps here; the
    300-token prefill runs them inline) run the same kernels on the same inputs: the logits, eager and under
    CUDA graphs, equal the inline order bit for bit."""
    _side_stream_runs(monkeypatch, branches)


@pytest.mark.parametrize("flags, branches", [
    ((("attention", "COMPRESS_BESIDE"), ("attention", "FUSED_ENTRY_STORE")), ("projections",)),
    ((("attention", "INDEXER_BESIDE"),), ("projections", "indexer")),
    ((("block", "STEP_TABLES_BESIDE"),), ("step_tables",)),
    ((("attention", "INDEXER_BESIDE"), ("block", "STEP_TABLES_BESIDE")), ("projections", "indexer", "step_tables"))])
def test_paged_step_branches_are_bit_identical(monkeypatch, flags, branches):
    """The paged FP8 decode step's branches -- attention.COMPRESS_BESIDE (the compressors' step work in the
    projections' branch; with FUSED_ENTRY_STORE), INDEXER_BESIDE (a CSA layer's indexer chain on a third stream,
    joined to the projections' branch before its scores) and block.STEP_TABLES_BESIDE (the later layers' step tables
    beside the first layer) -- on their side streams equal the same branches run inline bit for bit, eager and under
    CUDA graphs (the paged driver's steps: window closings, a rollback, multi-token steps; `_side_stream_runs` decodes
    unpaged states, where none of them applies)."""
    import importlib
    import sys
    from pathlib import Path

    import dsv4
    from dsv4.model import side_stream
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from paged_driver import PagedBatch
    for module, flag in flags:
        monkeypatch.setattr(importlib.import_module(f"dsv4.model.{module}"), flag, True)
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    for graphs in (False, True):
        runs = []
        for overlap in ((), branches):
            monkeypatch.setattr(side_stream, "OVERLAP", overlap)
            model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
            if graphs:
                model.enable_cuda_graphs(max_batch=8)
            runs.append(torch.cat(PagedBatch(model, "fp8").decode(12)))
        assert torch.isfinite(runs[0]).all()
        diff = float((runs[1].double() - runs[0].double()).abs().max())
        assert torch.equal(runs[1], runs[0]), f"graphs={graphs}: max |diff| {diff:.3e}"


def _side_stream_runs(monkeypatch, branches: tuple) -> None:
    from pathlib import Path

    import dsv4
    from dsv4.model import side_stream
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    prompts = [_ids(2048, n, seed=n + 1) for n in (300, 9, 64, 17)]
    runs = {}
    for overlap, graphs in (((), False), (branches, False), (branches, True)):
        monkeypatch.setattr(side_stream, "OVERLAP", overlap)
        model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
        if graphs:
            model.enable_cuda_graphs(max_batch=4)
        runs[graphs if overlap else None] = _batch_decode(model, prompts, 12)
    base = runs[None]
    assert torch.isfinite(base).all()
    for graphs in (False, True):
        diff = (runs[graphs].double() - base.double()).abs()
        assert torch.equal(runs[graphs], base), f"graphs={graphs}: max |diff| {float(diff.max()):.3e}, " \
            f"first differing step {int((diff.flatten(1).amax(1) > 0).nonzero()[0])}"


def _logits_flag_off_on(monkeypatch, flag: str, seed: int, module=None) -> list[torch.Tensor]:
    """The embedded model's logits with <module>.<flag> (default dsv4.model.attention) False, then True: every
    position of three prompts (prefilled alone), then 6 batched greedy decode steps."""
    from pathlib import Path

    import dsv4
    from dsv4.model import attention
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    prompts = [_ids(2048, n, seed=n + seed) for n in (300, 9, 64)]
    runs = []
    for on in (False, True):
        monkeypatch.setattr(module or attention, flag, on)
        model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
        prefill = [_step(model, model.new_sequence_state(), p, 0) for p in prompts]  # every position's logits
        runs.append(torch.cat(prefill + [_batch_decode(model, prompts, 6).flatten(0, 1)]))
    return runs


def test_inverse_rope_in_the_attention_kernels_is_bit_identical(monkeypatch):
    """attention.KERNEL_INVERSE_ROPE (the prefill and paged decode kernels rotate their outputs back themselves,
    `finish` skips its `norm_rope` launch): prefill and decode logits equal the separate launch's bit for bit."""
    runs = _logits_flag_off_on(monkeypatch, "KERNEL_INVERSE_ROPE", seed=3)
    assert torch.isfinite(runs[0]).all()
    assert torch.equal(runs[1], runs[0]), f"max |diff| {float((runs[1].double() - runs[0].double()).abs().max()):.3e}"


def test_block_sites_fused_across_blocks_match(monkeypatch, eager_prefill):
    """block.FUSE_BLOCK_SITES (each block's MoE post inside the next block's attention pre, `run_blocks`): the
    logits at every prefill position and over the decode steps agree with one site per sub-layer up to the fp32
    order of the attention site's mixes; the paged FP8 engine's whole-step graphs then give the eager greedy text."""
    from dsv4 import LLM, SamplingParams
    from dsv4.model import block

    _assert_bf16_level(_logits_flag_off_on(monkeypatch, "FUSE_BLOCK_SITES", seed=11, module=block),
                       "block sites fused vs not")
    prompts, params = ["def main():", "The", "import os\n"], SamplingParams(temperature=0.0, max_tokens=24)
    eager = [r.token_ids for r in LLM(device=DEVICE, kv_dtype="fp8", cuda_graphs=False).generate(prompts, params)]
    graphed = LLM(device=DEVICE, kv_dtype="fp8", cuda_graphs=True)
    assert [r.token_ids for r in graphed.generate(prompts, params)] == eager
    assert graphed.engine.model._graphs._steps


def test_q_norm_in_the_prefill_kernel_matches(monkeypatch):
    """attention.PREFILL_Q_NORM_IN_KERNEL (above PAIRED_QUERIES_MAX_T tokens the Gluon prefill kernel norms and
    rotates Q in shared memory, no `norm_rope` launch): logits at bf16 level of the separate launch's, the 300-token
    prompt's layers through the kernel's q norm (counted); with the threshold at 0 tokens the batched decode steps
    defer too and take `attend`'s `norm_rope` instead."""
    from dsv4.kernels import prefill_attention_gluon as pg
    from dsv4.model import attention

    normed, launch = [], pg.prefill_attention_gluon
    monkeypatch.setattr(pg, "prefill_attention_gluon",
                        lambda *a, **k: normed.append(k.get("q_norm")) or launch(*a, **k))
    for max_t in (attention.PAIRED_QUERIES_MAX_T, 0):
        monkeypatch.setattr(attention, "PAIRED_QUERIES_MAX_T", max_t)
        _assert_bf16_level(_logits_flag_off_on(monkeypatch, "PREFILL_Q_NORM_IN_KERNEL", seed=5),
                           f"q norm in the kernel above {max_t} tokens")
    assert any(x is not None for x in normed), "no prefill chunk took the kernel's q norm"


def test_paired_norms_match_the_separate_launches(monkeypatch):
    """attention.PAIRED_NORMS (the q latent's and the window kv's norms in one launch; on CSA layers the q heads'
    and the indexer q's glue in another): prefill logits at every prompt position and the decode steps after them
    agree with the separate launches' up to the q latent's sum order (rare last-bit flips)."""
    _assert_bf16_level(_logits_flag_off_on(monkeypatch, "PAIRED_NORMS", seed=7), "paired norms vs separate launches")


def _assert_bf16_level(runs: list[torch.Tensor], what: str) -> None:
    """The flag-on logits (runs[1]) within bf16 level of the flag-off ones: relative error and argmax agreement."""
    k, t = runs[1].double(), runs[0].double()
    assert torch.isfinite(t).all()
    rel = float((k - t).norm() / t.norm())
    agree = float((k.argmax(-1) == t.argmax(-1)).double().mean())
    print(f"{what}: rel {rel:.2e}, argmax agree {agree:.4f}")
    assert rel < 2e-2 and agree > 0.97, (rel, agree)


def test_fused_prefill_stores_match_the_torch_stores(monkeypatch):
    """attention.FUSED_PREFILL_STORES (kernel mode: prefill chunks store their window kv and the compressor's
    entries, finish included, through `cache_store.store_rows` as the paged decode step does) with
    compressor.FUSED_POOL (their pooling through `cache_store.pool_chunk`): after prompts
    around the ratio-4 / ratio-128 boundaries, every compressed layer's stored entries and window rows read back as
    the torch finish + quantise path's (RMS sums in another order: rare one-step flips of an element), and the
    decode logits that follow agree as the decode kernels' do with the torch attention."""
    import sys
    from pathlib import Path

    import dsv4
    from dsv4.model import attention, compressor
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from paged_driver import PagedBatch
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    stored, logits = [], []
    for fused in (False, True):
        monkeypatch.setattr(attention, "FUSED_PREFILL_STORES", fused)
        monkeypatch.setattr(compressor, "FUSED_POOL", fused)  # (the chunk's pooling in one launch too)
        model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
        batch = PagedBatch(model, "fp8")
        rows = []
        for seq in batch.seqs:
            for layer in batch.cache.state_of(seq).layers:
                rows.append(layer.window()[0].float())
                names = (["main"] if layer.spec.has_compressor else []) + (["index"] if layer.spec.has_indexer else [])
                rows += [layer.entries(name).float() for name in names if layer.num_entries(name)]
        stored.append(torch.cat([r.flatten() for r in rows]))
        logits.append(torch.cat(batch.decode(12)))
    assert stored[0].numel() > 10_000 and torch.isfinite(stored[0]).all()
    same = float((stored[0] == stored[1]).double().mean())
    rel = float((stored[1] - stored[0]).norm() / stored[0].norm())
    print(f"stored rows identical {same:.6f}, rel {rel:.2e}")
    assert same > 0.999 and rel < 2e-3, (same, rel)
    k, t = logits[1].double(), logits[0].double()
    rel = float((k - t).norm() / t.norm())
    agree = float((k.argmax(-1) == t.argmax(-1)).double().mean())
    assert rel < 2e-2 and agree > 0.97, (rel, agree)


def test_fused_prefill_reads_are_bit_identical(monkeypatch):
    """attention.FUSED_PREFILL_READS (prefill chunks read the window and the entries from the paged FP8 / FP4 pools
    through `cache_store.load_rows`, one launch each) and PREFILL_HCA_CAUSAL (HCA chunks: the kernel walks every
    complete entry without a list): the logits of the decode steps after the prompts equal the torch path's bit
    for bit (e4m3 / e2m1 times a power of two is exact in bf16; the walk visits the list's tiles)."""
    import sys
    from pathlib import Path

    import dsv4
    from dsv4.model import attention
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from paged_driver import PagedBatch
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    runs = []
    for fused in (False, True):
        monkeypatch.setattr(attention, "FUSED_PREFILL_READS", fused)
        monkeypatch.setattr(attention, "PREFILL_HCA_CAUSAL", fused)
        model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
        runs.append(torch.cat(PagedBatch(model, "fp8").decode(12)))
    assert torch.isfinite(runs[0]).all()
    assert torch.equal(runs[1], runs[0]), f"max |diff| {float((runs[1].double() - runs[0].double()).abs().max()):.3e}"
