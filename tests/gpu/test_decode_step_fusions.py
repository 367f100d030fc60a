"""Launches the paged FP8 decode step folds into others (kernel mode), each off vs on over the embedded model:
attention.FUSED_KV_STORE (the window kv stored by the q latent + kv norm launch, `norm_rope_two(store_b=)`),
FUSED_ENTRY_STORE (the compressors' entries stored by the pooling launch's last arrivers),
DECODE_Q_NORM_IN_KERNEL (sliding / HCA layers' q heads' norm + RoPE in the decode attention kernel,
`decode_attention(q_norm=)`), COMPRESS_BESIDE (the compressors' step work moved to the side stream),
indexer.TOPK_IN_SCORES (the CSA layers' top-k picked by the scores launch), and the opt-in branches INDEXER_BESIDE
(the CSA indexer's chain beside wq_b) and block.STEP_TABLES_BESIDE (the later layers' step tables). Each saves
its launch wherever it applies (or moves it off the main stream) and keeps the decode logits and the cache rows
read back. On the CPU through Triton's interpreter (a shorter run), on the GPU in full (window closings, a
rollback, MTP-like multi-token steps)."""
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


def _decode(monkeypatch, flag: str | None, *more: str):
    """(decode logits, cache rows read back, {counted function: calls}, the layers' `_attend_step` calls) of the
    embedded model in kernel mode with attention.`flag` (and `more`) on and the other FLAGS off (None: all off)."""
    from dsv4.kernels import cache_store, norm_rope
    from dsv4.model import attention

    # the interpreter: two prompts prefilled in one forward and one decode step (half the time of one forward each
    # and two steps; the GPU runs the full drive)
    prompts, steps = (PROMPTS, 12) if DEV == "cuda" else ((5, 9), 1)
    for name in FLAGS:
        monkeypatch.setattr(attention, name, name == flag or name in more)
    model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", DEV, torch.bfloat16, kernels="triton")
    batch = PagedBatch(model, "fp8", prompts=prompts, together=DEV != "cuda")
    calls, layer_steps = {"store_rows": 0, "norm_rope": 0}, []

    def counted(module, name):
        real = getattr(module, name)

        def count(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        monkeypatch.setattr(module, name, count)

    counted(cache_store, "store_rows")
    counted(norm_rope, "norm_rope")
    real_step = attention.Attention._attend_step
    monkeypatch.setattr(attention.Attention, "_attend_step", lambda *a: layer_steps.append(a[0]) or real_step(*a))
    logits = torch.cat(batch.decode(steps))
    rows = []  # every layer's window rows and compressed entries
    for seq in batch.seqs:
        for layer in batch.cache.state_of(seq).layers:
            rows.append(layer.window()[0].float().flatten())
            names = (["main"] if layer.spec.has_compressor else []) + (["index"] if layer.spec.has_indexer else [])
            rows += [layer.entries(name).float().flatten() for name in names if layer.num_entries(name)]
    monkeypatch.undo()
    assert len(layer_steps) >= steps * len(model.layers) and torch.isfinite(logits).all()
    return logits, torch.cat(rows), calls, layer_steps


def _where_called(monkeypatch, branch: tuple, call: tuple, where: dict) -> None:
    """Patch `branch` (class, name) to mark its extent and `call` (class, name) to count in `where` whether each of
    its calls came from inside the branch ("branch") or not ("main")."""
    inside = []
    real_branch, real_call = getattr(*branch), getattr(*call)

    def in_branch(*a):
        inside.append(1)
        try:
            return real_branch(*a)
        finally:
            inside.pop()

    def counted(*a):
        where["branch" if inside else "main"] += 1
        return real_call(*a)
    monkeypatch.setattr(*branch, in_branch)
    monkeypatch.setattr(*call, counted)


FLAGS = ("FUSED_KV_STORE", "FUSED_ENTRY_STORE", "DECODE_Q_NORM_IN_KERNEL", "COMPRESS_BESIDE", "INDEXER_BESIDE")
_BASELINE = []  # every flag off: one run shared by the tests of a session


def _baseline(monkeypatch):
    if not _BASELINE:
        _BASELINE.append(_decode(monkeypatch, None))
    return _BASELINE[0]


def test_fused_kv_store_is_bit_identical(monkeypatch):
    """One `store_rows` call fewer per layer and paged decode step; logits and cache rows bit-identical."""
    off_logits, off_rows, off_calls, _ = _baseline(monkeypatch)
    on_logits, on_rows, on_calls, layer_steps = _decode(monkeypatch, "FUSED_KV_STORE")
    assert off_calls["store_rows"] - on_calls["store_rows"] == len(layer_steps), (off_calls, on_calls)
    assert torch.equal(on_logits, off_logits), f"max |diff| {float((on_logits - off_logits).abs().max()):.3e}"
    assert torch.equal(on_rows, off_rows)


def test_fused_entry_store_is_bit_identical(monkeypatch):
    """One `store_rows` call fewer per compressor (CSA: main and indexer, HCA: main) and paged decode step; logits
    and cache rows bit-identical."""
    off_logits, off_rows, off_calls, _ = _baseline(monkeypatch)
    on_logits, on_rows, on_calls, layer_steps = _decode(monkeypatch, "FUSED_ENTRY_STORE")
    compressors = sum((attn.compressor is not None) + (attn.indexer is not None) for attn in layer_steps)
    assert compressors and off_calls["store_rows"] - on_calls["store_rows"] == compressors, (off_calls, on_calls)
    assert torch.equal(on_logits, off_logits), f"max |diff| {float((on_logits - off_logits).abs().max()):.3e}"
    assert torch.equal(on_rows, off_rows)


_COMPRESS_BESIDE = []  # the COMPRESS_BESIDE run: shared by two tests (the interpreter's time)


def _compress_beside(monkeypatch):
    """(logits, cache rows, `_attend_step` calls, where the compressors' launches ran, where the picks ran) of the
    COMPRESS_BESIDE run, counted as `_where_called` says."""
    from dsv4.model import attention, indexer
    if not _COMPRESS_BESIDE:
        where, picks = {"branch": 0, "main": 0}, {"branch": 0, "main": 0}
        _where_called(monkeypatch, (attention.Attention, "_project_and_compress"),
                      (attention.Attention, "_compress_step_launch"), where)
        _where_called(monkeypatch, (attention.Attention, "_pick_beside"), (indexer.Indexer, "pick_from_pool"), picks)
        logits, rows, _, layer_steps = _decode(monkeypatch, "COMPRESS_BESIDE")
        _COMPRESS_BESIDE.append((logits, rows, layer_steps, where, picks))
    return _COMPRESS_BESIDE[0]


def test_compress_beside_is_bit_identical(monkeypatch):
    """COMPRESS_BESIDE: every compressor's step work runs in the projections' side branch (here inline: the CPU has
    no side stream; the GPU run checks the streams), none on the main stream in `attend`; logits and cache rows
    bit-identical."""
    off_logits, off_rows, _, _ = _baseline(monkeypatch)
    on_logits, on_rows, layer_steps, where, _ = _compress_beside(monkeypatch)
    compressors = sum((attn.compressor is not None) + (attn.indexer is not None) for attn in layer_steps)
    # (the prompts' forwards count too: they run as paged steps before the decode steps `layer_steps` counts)
    assert where["main"] == 0 and where["branch"] >= compressors > 0, (where, compressors)
    assert torch.equal(on_logits, off_logits), f"max |diff| {float((on_logits - off_logits).abs().max()):.3e}"
    assert torch.equal(on_rows, off_rows)


def test_decode_q_norm_in_kernel(monkeypatch):
    """One `norm_rope` call fewer per sliding / HCA layer and paged decode step; the kernel's per-head sums of
    squares run in another fp32 order than `norm_rope`'s (a rare flip of a bf16 mean), so the logits agree to bf16
    level and in their top-1 (bit-identical in the interpreter), the cache rows (not touched) exactly."""
    off_logits, off_rows, off_calls, _ = _baseline(monkeypatch)
    on_logits, on_rows, on_calls, layer_steps = _decode(monkeypatch, "DECODE_Q_NORM_IN_KERNEL")
    without_indexer = sum(1 for attn in layer_steps if attn.indexer is None)
    assert without_indexer and off_calls["norm_rope"] - on_calls["norm_rope"] == without_indexer, (off_calls, on_calls)
    assert torch.equal(on_rows, off_rows)
    rel = float((on_logits.double() - off_logits.double()).norm() / off_logits.double().norm())
    agree = float((on_logits.argmax(-1) == off_logits.argmax(-1)).double().mean())
    print(f"q norm in the decode kernel vs norm_rope: rel {rel:.2e}, top-1 agreement {agree:.4f}")
    assert rel < 1e-2 and agree > 0.97, (rel, agree)


def test_topk_in_scores_is_bit_identical(monkeypatch):
    """indexer.TOPK_IN_SCORES: the CSA layers' decode top-k picked by the scores launch's last arrivers
    (`indexer_scores.indexer_pick`), no top-k after the scores (`Indexer._pick` never called); logits and cache rows
    bit-identical."""
    from dsv4.model import indexer

    off_logits, off_rows, _, _ = _baseline(monkeypatch)
    picks = []
    real = indexer.Indexer._pick
    monkeypatch.setattr(indexer.Indexer, "_pick", lambda *a, **k: picks.append(1) or real(*a, **k))
    monkeypatch.setattr(indexer, "TOPK_IN_SCORES", True)
    on_logits, on_rows, _, layer_steps = _decode(monkeypatch, None)
    assert any(attn.indexer is not None for attn in layer_steps) and not picks
    assert torch.equal(on_logits, off_logits), f"max |diff| {float((on_logits - off_logits).abs().max()):.3e}"
    assert torch.equal(on_rows, off_rows)


def test_branches_beside(monkeypatch):
    """INDEXER_BESIDE (with COMPRESS_BESIDE): every CSA layer's decode picks come from the indexer's branch (here
    inline: the CPU has no side stream; the GPU run has the streams), the scores and top-k queued in it; with
    block.STEP_TABLES_BESIDE too (one run for both: the interpreter's time), each layer's `Attention.step_tables`
    runs once per paged step. With q normed by its own `norm_rope` launch (DECODE_Q_NORM_IN_KERNEL off) the logits
    and cache rows are bit-identical to the chain on the main stream; with the attention kernel norming q they agree
    as test_decode_q_norm_in_kernel says."""
    from dsv4.model import attention, block, indexer

    picks, tables = {"branch": 0, "main": 0}, []
    real_tables = attention.Attention.step_tables

    def counting(step_tables: bool = False):  # (`_decode` undoes the patches at its end)
        _where_called(monkeypatch, (attention.Attention, "_pick_beside"), (indexer.Indexer, "pick_from_pool"), picks)
        monkeypatch.setattr(attention.Attention, "step_tables", lambda *a: tables.append(a[0]) or real_tables(*a))
        monkeypatch.setattr(block, "STEP_TABLES_BESIDE", step_tables)
        return monkeypatch
    off_logits, off_rows, _, _, off_picks = _compress_beside(monkeypatch)
    assert off_picks["main"] > 0 and off_picks["branch"] == 0, off_picks
    on_logits, on_rows, _, layer_steps = _decode(counting(step_tables=True), "COMPRESS_BESIDE", "INDEXER_BESIDE")
    csa = sum(1 for attn in layer_steps if attn.indexer is not None)
    assert picks["main"] == 0 and picks["branch"] >= csa > 0, (picks, csa)
    # (every paged step calls it once per layer: the decode steps `layer_steps` counts, and the prompts')
    assert len(tables) >= len(layer_steps) and set(map(id, tables)) == set(map(id, layer_steps))
    assert torch.equal(on_logits, off_logits), f"max |diff| {float((on_logits - off_logits).abs().max()):.3e}"
    assert torch.equal(on_rows, off_rows)
    if DEV != "cuda":  # (the interpreter's q norm is the same bits either way: the GPU run checks the kernel's)
        return
    kern_logits, kern_rows, _, _ = _decode(monkeypatch, "COMPRESS_BESIDE", "INDEXER_BESIDE", "DECODE_Q_NORM_IN_KERNEL")
    assert torch.equal(kern_rows, off_rows)
    rel = float((kern_logits.double() - off_logits.double()).norm() / off_logits.double().norm())
    agree = float((kern_logits.argmax(-1) == off_logits.argmax(-1)).double().mean())
    print(f"indexer beside, q norm in the decode kernel vs norm_rope: rel {rel:.2e}, top-1 agreement {agree:.4f}")
    assert rel < 1e-2 and agree > 0.97, (rel, agree)

