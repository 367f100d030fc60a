"""attention.FUSED_KV_STORE (kernel mode, paged FP8 decode steps): the window kv stored by the q latent + kv norm
launch (`norm_rope_two(store_b=)`) instead of a `cache_store.store_rows` launch of its own. On the embedded model,
off vs on: the decode logits and every window row read back are bit-identical, and each decode step makes one
`store_rows` call fewer per layer. On the CPU through Triton's interpreter (a shorter run), on the GPU in full
(window closings, a rollback, MTP-like multi-token steps)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

import dsv4
from dsv4 import load_model

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paged_driver import PROMPTS, PagedBatch  # noqa: E402


def test_fused_kv_store_is_bit_identical(monkeypatch):
    from dsv4.kernels import cache_store
    from dsv4.model import attention

    prompts, steps = (PROMPTS, 12) if DEV == "cuda" else ((5, 9), 2)
    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    real, real_step = cache_store.store_rows, attention.Attention._attend_step
    runs, stores = [], []
    for fused in (False, True):
        monkeypatch.setattr(attention, "FUSED_KV_STORE", fused)
        model = load_model(path, DEV, torch.bfloat16, kernels="triton")
        batch = PagedBatch(model, "fp8", prompts=prompts)
        calls, layer_steps = [], []
        monkeypatch.setattr(cache_store, "store_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
        monkeypatch.setattr(attention.Attention, "_attend_step",
                            lambda *a: layer_steps.append(1) or real_step(*a))
        logits = torch.cat(batch.decode(steps))
        windows = torch.cat([layer.window()[0].float().flatten() for seq in batch.seqs
                             for layer in batch.cache.state_of(seq).layers])
        runs.append((logits, windows))
        stores.append(len(calls))
    (logits_off, windows_off), (logits_on, windows_on) = runs
    assert torch.isfinite(logits_off).all() and windows_off.numel() > 1000
    assert torch.equal(logits_on, logits_off), f"max |diff| {float((logits_on - logits_off).abs().max()):.3e}"
    assert torch.equal(windows_on, windows_off)
    # one window store fewer per layer and paged decode step (every decode forward: steps x layers at least)
    assert len(layer_steps) >= steps * len(model.layers)
    assert stores[0] - stores[1] == len(layer_steps), (stores, len(layer_steps))
