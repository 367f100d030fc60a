"""L2 prefetch on the side stream (dsv4.kernels.l2_prefetch, dsv4.model.prefetch): the launch covers any
tensor size and writes nothing, and a model with every prefetch site on decodes the same logits bit for bit,
eagerly and under whole-step CUDA graphs (a prefetch only changes where the bytes come from)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from dsv4 import load_model
from dsv4.kernels.l2_prefetch import prefetch_l2_tensors
from dsv4.model import prefetch

DEVICE = os.environ.get("DSV4_TEST_DEVICE", "cuda")
ALL_SITES = ("attn_in", "attn_out", "ffn")


@pytest.mark.parametrize("chunk", [16, 4096, 16384, 1 << 20])
def test_prefetch_covers_any_size_and_writes_nothing(chunk):
    gen = torch.Generator(device=DEVICE).manual_seed(chunk)
    sizes = (15, 16, 48, 4096 + 16, (1 << 20) + 48, 5 << 20)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, device=DEVICE, generator=gen) for n in sizes]
    ts.append(torch.randn(3, 1000, device=DEVICE, generator=gen).to(torch.bfloat16))
    before = [t.clone() for t in ts]
    prefetch_l2_tensors(ts, chunk)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(ts, before))


def test_prefetch_refuses_bad_arguments():
    with pytest.raises(ValueError, match="chunk"):
        prefetch_l2_tensors([torch.ones(64, device=DEVICE)], 24)
    with pytest.raises(ValueError, match="contiguous"):
        prefetch_l2_tensors([torch.ones(64, 64, device=DEVICE).t()])


@pytest.mark.parametrize("graphs", [False, True])
def test_prefetch_sites_keep_the_logits(monkeypatch, graphs):
    if DEVICE != "cuda":
        pytest.skip("the model's kernels and CUDA graphs need the GPU")
    import dsv4
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from paged_driver import PagedBatch

    path = Path(dsv4.__file__).parent / "assets" / "tiny"
    monkeypatch.setattr(prefetch, "MIN_BYTES", 0)  # the embedded model's weights are all small
    runs = {}
    for sites in ((), ALL_SITES):
        monkeypatch.setattr(prefetch, "SITES", sites)
        model = load_model(path, DEVICE, torch.bfloat16, kernels="triton")
        if graphs:
            model.enable_cuda_graphs(max_batch=8)
        runs[sites] = torch.cat(PagedBatch(model, "fp8").decode(12))
        if graphs:
            assert model._graphs._steps  # whole-step graphs were captured
    base = runs[()]
    assert torch.isfinite(base).all()
    diff = (runs[ALL_SITES].double() - base.double()).abs()
    assert torch.equal(runs[ALL_SITES], base), f"max |diff| {float(diff.max()):.3e}"
