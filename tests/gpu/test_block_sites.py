"""block.FUSE_BLOCK_SITES on the mHC kernels (on the CPU through Triton's interpreter): the embedded model in bf16
with every block's mHC sites on dsv4.kernels.mhc, each block's MoE post left to the next block's attention pre
(`run_blocks`), against one site per sub-layer. The residual streams X' keep their bits (the same post
expression) and only the attention site's mixes may be summed in another fp32 order (other tiles on the GPU; in
the interpreter the logits come out bit-identical), so prefill and decode logits agree to bf16 level; every block
boundary must go through the fused site (counted)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

import dsv4
from dsv4 import load_model
from dsv4.model import ForwardContext, set_forward_context

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
STEPS = 3 if DEV == "cuda" else 1  # decode steps after the prompt (the interpreter: one, for its time)


def _logits(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """Prefill logits at every position, then `steps` greedy decode steps' logits."""
    state, out = model.new_sequence_state(), []
    ids, start = prompt, 0
    with torch.no_grad():
        for _ in range(steps + 1):
            n = ids.numel()
            with set_forward_context(ForwardContext([n], [state])):
                h = model(ids.to(DEV), torch.arange(start, start + n, device=DEV))
                out.append(model.compute_logits(h).float().cpu())
            start += n
            ids = out[-1][-1:].argmax(-1)
    return torch.cat(out)


def test_fused_block_sites_match_one_site_per_sub_layer(monkeypatch):
    from dsv4.model import block

    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", DEV, torch.bfloat16,
                       kernels="triton" if DEV == "cuda" else "torch")
    for b in model.layers:
        b.use_mhc_kernels()
    prompt = torch.randint(2, 2048, (24,), generator=torch.Generator().manual_seed(36))
    runs, sites = [], []
    real = block.Block._pre_after
    monkeypatch.setattr(block.Block, "_pre_after", lambda *a: sites.append(1) or real(*a))
    for fuse in (False, True):
        monkeypatch.setattr(block, "FUSE_BLOCK_SITES", fuse)
        runs.append(_logits(model, prompt, STEPS))
    t, k = runs[0].double(), runs[1].double()
    assert torch.isfinite(t).all()
    assert len(sites) == (STEPS + 1) * (len(model.layers) - 1), "the fused path must take over every block boundary"
    rel = float((k - t).norm() / t.norm())
    agree = float((k.argmax(-1) == t.argmax(-1)).double().mean())
    print(f"fused block sites vs one site per sub-layer: rel {rel:.2e}, argmax agree {agree:.4f}")
    assert rel < 2e-2 and agree > 0.9, (rel, agree)


def test_piecewise_graph_pieces_keep_the_fused_sites(monkeypatch, eager_prefill):
    """The piecewise decode graphs' pieces (dsv4.model.graphs, run eagerly: capture=False) take the same fused
    sites as the eager forward, so graph replay keeps its bits (session 44: with one site per sub-layer in the
    pieces, GPU graph replay differed from the eager decode in the last bits since FUSE_BLOCK_SITES, session 37)."""
    from dsv4.model import block

    monkeypatch.setattr(block, "FUSE_BLOCK_SITES", True)
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    prompt = torch.randint(2, 2048, (19,), generator=torch.Generator().manual_seed(44))
    sites, runs = [], []
    real = block.Block._pre_after
    monkeypatch.setattr(block.Block, "_pre_after", lambda *a: sites.append(1) or real(*a))
    for graphs in (False, True):
        model = load_model(path, DEV, torch.bfloat16, kernels="triton" if DEV == "cuda" else "torch")
        for b in model.layers:
            b.use_mhc_kernels()
        if graphs:
            model.enable_cuda_graphs(max_batch=2, capture=False)  # the pieces; GPU capture: test_model_gpu.py
        sites.clear()
        runs.append(_logits(model, prompt, STEPS))
        assert len(sites) == (STEPS + 1) * (len(model.layers) - 1), (graphs, len(sites))
    assert torch.isfinite(runs[0]).all()
    assert torch.equal(runs[0], runs[1])
