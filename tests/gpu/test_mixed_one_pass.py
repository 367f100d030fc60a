"""A mixed step in one forward (dsv4.model.mixed_steps.ONE_PASS_MIXED_STEPS) against the same step split in two, in
kernel mode over paged FP8 pools: the embedded model's prompts prefilled in one forward (the two shortest as decode
rows), then steps where some sequences bring decode rows (1 token, or a verify-like row of 3) while another brings a
prompt chunk, then a plain decode step. The
decode rows attend through the fixed-shape step inside the chunks' forward (its attention kernel asked to apply the
inverse RoPE exactly where the chunks' attention does: on CUDA the prefill kernel does, in the interpreter neither),
their stateless parts run with the chunks' rows. Every logit row stays within bf16 rounding of the split's (the
GEMMs see other row counts), and each later step reads what the earlier ones left in the pools.
On the GPU with the rest of tests/gpu; it also runs in Triton's interpreter (DSV4_TEST_DEVICE=cpu TRITON_INTERPRET=1,
3 min on one core), which `make test` leaves out for its time."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (tests/: the paged driver)
PROMPTS = (9, 24, 5, 1)  # prefilled in one forward: 5 and 1 are decode rows (at most max_rollback + 1 tokens)


@pytest.fixture(scope="module")
def model():
    import dsv4
    from dsv4 import load_model
    m = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", DEV, torch.bfloat16, kernels="triton")
    m.enable_cuda_graphs(max_batch=8, capture=DEV == "cuda")
    return m


def _run(model, one_pass: bool, monkeypatch):
    from dsv4.model import attention, mixed_steps
    from paged_driver import PagedBatch

    monkeypatch.setattr(mixed_steps, "SPLIT_MIXED_STEPS", True)
    monkeypatch.setattr(mixed_steps, "ONE_PASS_MIXED_STEPS", one_pass)
    # forwards of more rows leave the q heads' norm to the attention kernels (the decode rows': the step kernel's
    # q_norm, in CSA layers too); here the 40- and 24-row forwards do, the 13-row one pairs it with the indexer's
    monkeypatch.setattr(attention, "PAIRED_QUERIES_MAX_T", 16)
    gen = torch.Generator().manual_seed(4)
    batch = PagedBatch(model, "fp8", prompts=PROMPTS, together=True)
    s = batch.seqs
    out = [batch.prefill_logits, batch.forward(s, torch.randint(2, 500, (3 + 21,), generator=gen), [1, 1, 1, 21])]
    out.append(batch.forward([s[1], s[3], s[2]], torch.randint(2, 500, (3 + 9 + 1,), generator=gen), [3, 9, 1]))
    out += batch.decode(1, seed=6)
    return out


def test_one_pass_matches_the_split(model, monkeypatch, close_bf16):
    from dsv4.model import attention

    heads = []
    real = attention.attend_head  # (mixed_steps' function, as `Attention.attend` calls it)
    monkeypatch.setattr(attention, "attend_head", lambda attn, pre, step, *a: (
        heads.append(step.size), real(attn, pre, step, *a))[1])
    with torch.no_grad():
        split = _run(model, False, monkeypatch)
        assert heads == []
        one = _run(model, True, monkeypatch)
    assert heads == [n for n in (6, 3, 4) for _ in model.layers]  # the three mixed steps went in one pass
    assert len(split) == len(one) == 4
    for i, (a, b) in enumerate(zip(split, one)):
        assert torch.isfinite(b).all()
        for r in range(a.shape[0]):
            close_bf16(b[r], a[r], rel=2e-2, what=f"forward {i} row {r}")
