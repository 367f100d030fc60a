"""Launches the paged FP8 decode step folds into others (kernel mode), each off vs on over the embedded model:
attention.FUSED_KV_STORE (the window kv stored by the q latent + kv norm launch, `norm_rope_two(store_b=)`) and
DECODE_Q_NORM_IN_KERNEL (sliding / HCA layers' q heads' norm + RoPE in the decode attention kernel,
`decode_attention(q_norm=)`). Each saves its launch on every layer it applies to, and keeps the decode logits and the
window rows read back. On the CPU through Triton's interpreter (a shorter run), on the GPU in full (window closings,
a rollback, MTP-like multi-token steps)."""
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


def _decode(monkeypatch, flag: str, counted, on: bool):
    """(decode logits, window rows, calls of `counted` = (module, name), paged decode steps x layers) of the
    embedded model in kernel mode with attention.`flag` = on."""
    from dsv4.model import attention

    prompts, steps = (PROMPTS, 12) if DEV == "cuda" else ((5, 9), 2)
    monkeypatch.setattr(attention, flag, on)
    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", DEV, torch.bfloat16, kernels="triton")
    batch = PagedBatch(model, "fp8", prompts=prompts)
    calls, layer_steps = [], []
    real, real_step = getattr(*counted), attention.Attention._attend_step
    monkeypatch.setattr(*counted, lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(attention.Attention, "_attend_step", lambda *a: layer_steps.append(a[0]) or real_step(*a))
    logits = torch.cat(batch.decode(steps))
    windows = torch.cat([layer.window()[0].float().flatten() for seq in batch.seqs
                         for layer in batch.cache.state_of(seq).layers])
    monkeypatch.undo()
    assert len(layer_steps) >= steps * len(model.layers) and torch.isfinite(logits).all()
    return logits, windows, len(calls), layer_steps


def test_fused_kv_store_is_bit_identical(monkeypatch):
    """One `store_rows` call fewer per layer and paged decode step; logits and windows bit-identical."""
    from dsv4.kernels import cache_store

    off_logits, off_windows, off_calls, _ = _decode(monkeypatch, "FUSED_KV_STORE", (cache_store, "store_rows"), False)
    on_logits, on_windows, on_calls, layer_steps = _decode(monkeypatch, "FUSED_KV_STORE",
                                                           (cache_store, "store_rows"), True)
    assert torch.equal(on_logits, off_logits), f"max |diff| {float((on_logits - off_logits).abs().max()):.3e}"
    assert torch.equal(on_windows, off_windows)
    assert off_calls - on_calls == len(layer_steps), (off_calls, on_calls, len(layer_steps))


def test_decode_q_norm_in_kernel(monkeypatch):
    """One `norm_rope` call fewer per sliding / HCA layer and paged decode step; the kernel's per-head sums of
    squares run in another fp32 order than `norm_rope`'s (a rare flip of a bf16 mean), so the logits agree to bf16
    level and in their top-1 (bit-identical in the interpreter), the windows (not touched) exactly."""
    from dsv4.kernels import norm_rope

    off_logits, off_windows, off_calls, _ = _decode(monkeypatch, "DECODE_Q_NORM_IN_KERNEL", (norm_rope, "norm_rope"),
                                                    False)
    on_logits, on_windows, on_calls, layer_steps = _decode(monkeypatch, "DECODE_Q_NORM_IN_KERNEL",
                                                           (norm_rope, "norm_rope"), True)
    without_indexer = sum(1 for attn in layer_steps if attn.indexer is None)
    assert without_indexer and off_calls - on_calls == without_indexer, (off_calls, on_calls, without_indexer)
    assert torch.equal(on_windows, off_windows)
    rel = float((on_logits.double() - off_logits.double()).norm() / off_logits.double().norm())
    agree = float((on_logits.argmax(-1) == off_logits.argmax(-1)).double().mean())
    print(f"q norm in the decode kernel vs norm_rope: rel {rel:.2e}, top-1 agreement {agree:.4f}")
    assert rel < 1e-2 and agree > 0.97, (rel, agree)
