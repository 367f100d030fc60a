"""The opt-in side-stream branch "pair_q_latent" (`Attention._fp8_pair`): a CSA layer's indexer.wq_b beside its wq_b
where the two are not stacked. The same kernels on the same inputs, so the embedded model's logits are bit-identical
with and without it, over prefills and multi-sequence decode steps (the embedded model stacks the pair only at one
row, so the steps of several rows take the branch)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import dsv4
from dsv4 import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="streams: CUDA only")


def test_index_query_beside_gives_the_same_logits(monkeypatch):
    from dsv4.model import side_stream
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from paged_driver import PagedBatch

    names, real = [], side_stream.start_beside

    def counted(device, name, rows, fn, *args):
        names.append(name)
        return real(device, name, rows, fn, *args)

    monkeypatch.setattr(side_stream, "start_beside", counted)  # (the other branches import it by name)
    runs = []
    for on in (False, True):
        monkeypatch.setattr(side_stream, "OVERLAP", side_stream.OVERLAP + (("pair_q_latent",) if on else ()))
        model = load_model(Path(dsv4.__file__).parent / "assets" / "tiny", "cuda", torch.bfloat16, kernels="triton")
        runs.append(torch.cat(PagedBatch(model, "fp8").decode(8)))
        assert ("pair_q_latent" in names) == on  # the branch ran (only) when asked for
    assert torch.isfinite(runs[0]).all() and runs[0].std() > 0
    assert torch.equal(runs[1], runs[0]), f"max |diff| {float((runs[1] - runs[0]).abs().max()):.3e}"
