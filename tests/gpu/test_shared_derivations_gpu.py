"""The eager attention's derivations shared by the layers of a forward (`rope.SHARE_ACROSS_LAYERS`: the paged slot
lists, the compressors' entry positions and their RoPE tables, the indexer's visible counts) change no bit: the
embedded model in kernel mode over paged FP8 pools -- fresh prompts across the window, ratio-4 and ratio-128
boundaries, chunks after them, then decode steps -- gives the same logits and leaves the same pool bytes with the flag
off and on, trash pages included (a decode step's rows store their open windows' entries at slots of their own)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # (tests/: the paged driver)


@pytest.fixture(scope="module")
def model():
    import dsv4
    from dsv4 import load_model
    return load_model(Path(dsv4.__file__).parent / "assets" / "tiny", DEV, torch.bfloat16, kernels="triton")


def _run(model, share: bool, monkeypatch):
    from dsv4.model import rope
    from paged_driver import PagedBatch

    monkeypatch.setattr(rope, "SHARE_ACROSS_LAYERS", share)
    gen = torch.Generator().manual_seed(3)
    batch = PagedBatch(model, "fp8", prompts=(16, 131, 5, 260))
    out = [batch.forward(batch.seqs, torch.randint(2, 500, (4 * 37,), generator=gen))]  # a chunk each
    out += batch.decode(3, seed=5)
    return out, _pool_bytes(batch.cache.pools)


def _pool_bytes(pools) -> list[torch.Tensor]:
    return [t.clone() for _, t in pools._byte_views()]


def test_sharing_changes_no_bit(model, monkeypatch):
    with torch.no_grad():
        off_logits, off_pools = _run(model, False, monkeypatch)
        on_logits, on_pools = _run(model, True, monkeypatch)
    assert len(off_logits) == len(on_logits) and len(off_pools) == len(on_pools)
    for a, b in zip(off_logits, on_logits):
        assert torch.isfinite(a).all() and torch.equal(a, b)
    for i, (a, b) in enumerate(zip(off_pools, on_pools)):
        assert torch.equal(a, b), f"pool tensor {i} differs in pages {(a != b).any(1).nonzero().flatten().tolist()}"
    assert any(bool(t.any()) for t in on_pools), "nothing was stored"
