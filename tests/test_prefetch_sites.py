"""The L2-prefetch sites (dsv4.model.prefetch) on CPU: no-ops there, and each site's list names the weights
its sub-layer streams (a list that missed one would prefetch nothing useful; the GPU tests check the values)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import dsv4

from dsv4.kernels.l2_prefetch import prefetch_l2_tensors, prefetch_l2_tensors_ref
from dsv4.model import prefetch

TINY = Path(dsv4.__file__).parent / "assets" / "tiny"


@pytest.fixture(scope="module")
def tiny_model():
    return dsv4.load_model(TINY)


def _covered(w: torch.Tensor, listed: list[torch.Tensor]) -> bool:
    """Whether w's bytes lie inside one listed tensor (a stacked pair lists the stack, of which w is a view)."""
    lo, hi = w.data_ptr(), w.data_ptr() + w.numel() * w.element_size()
    return any(t.data_ptr() <= lo and hi <= t.data_ptr() + t.numel() * t.element_size() for t in listed)


def test_sites_list_the_streamed_weights(tiny_model):
    for block in tiny_model.layers:
        attn, moe = block.attn, block.ffn
        listed = prefetch.attention_input_weights(attn)
        streamed = [attn.wq_a, attn.wkv, attn.wq_b] + ([attn.indexer.wq_b] if attn.indexer else [])
        assert all(_covered(lin.weight, listed) for lin in streamed)
        listed = prefetch.attention_output_weights(attn)
        assert all(_covered(lin.weight, listed) for lin in (attn.wo_a, attn.wo_b))
        listed = prefetch.ffn_weights(moe)
        assert _covered(moe.gate.weight, listed)
        if moe.shared_experts is not None:
            assert all(_covered(lin.weight, listed) for lin in (moe.shared_experts.w1, moe.shared_experts.w2))


def test_prefetch_is_a_noop_off_cuda(monkeypatch):
    monkeypatch.setattr(prefetch, "SITES", ("attn_in",))
    called = []
    join = prefetch.prefetch_beside(torch.device("cpu"), "attn_in", 1, lambda: called.append(1) or [])
    assert join() is None and not called  # the weight list is not even built
    w = torch.randn(300, 7)
    before = w.clone()
    prefetch_l2_tensors([w])
    prefetch_l2_tensors_ref([w])
    assert torch.equal(w, before)
    with pytest.raises(ValueError, match="multiple of 16"):
        prefetch_l2_tensors([w], chunk=100)
    with pytest.raises(ValueError, match="contiguous"):
        prefetch_l2_tensors([w.t()])
