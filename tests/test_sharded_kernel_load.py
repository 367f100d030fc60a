"""Kernel mode under TP/EP, the loading half (CPU): a rank keeps exactly its slice of every stored
FP8 weight and packs exactly its own experts. The kernels themselves need CUDA (tests/gpu and
`python -m dsv4.distributed.selfcheck --device cuda --kernels triton`); here the kernel-mode model is
built on the CPU with the mode forced, which is enough for loading and packing."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import dsv4.model.deepseek_v4 as dv
from dsv4.checkpoint.writer import random_master_weights, tiny_config
from dsv4.distributed.sharding import Layout
from dsv4.model.linear import Linear


@pytest.fixture
def kernel_mode(monkeypatch):
    monkeypatch.setattr(dv, "resolve_kernels", lambda kernels, dtype, device: "triton")


def _build(cfg, masters, parallel):
    m = dv.DeepseekV4ForCausalLM(cfg, torch.bfloat16, parallel=parallel, kernels="triton")
    m.load_weights(masters.items())
    m.load_mtp_weights(masters.items())
    m.finalize_weights()
    return m


@pytest.mark.parametrize("tp,ep", [(2, 2), (2, 1), (1, 2)])
def test_rank_keeps_its_slices_and_packs_its_experts(kernel_mode, tp, ep):
    cfg = tiny_config("fp4", "sliding,csa,hca", num_hash_layers=1, moe_intermediate_size=256)
    masters = random_master_weights(cfg, seed=4)
    whole = _build(cfg, masters, None)
    whole_linears = {n: m for n, m in whole.named_modules() if isinstance(m, Linear) and m.kernel_format}
    for rank in range(max(tp, ep)):
        ps = SimpleNamespace(tp=tp, ep=ep, rank=rank)  # Layout arithmetic only: loading needs no collective
        part = _build(cfg, masters, ps)
        layout = Layout(cfg, tp, ep, rank)
        cut_seen = 0
        for name, lin in part.named_modules():
            if not isinstance(lin, Linear) or lin.kernel_format not in ("fp8", "w8a16") or lin.weight.numel() == 0:
                continue
            ref = whole_linears[name]
            cut = layout.cut(f"{name}.weight")
            w, s = ref.weight, ref.scale
            if cut is not None:
                cut_seen += 1
                w = w.narrow(cut.dim, cut.start, cut.length)
                s = s.narrow(cut.dim, cut.start // 128, cut.length // 128)
            assert torch.equal(lin.weight.view(torch.uint8), w.view(torch.uint8)), name
            assert torch.equal(lin.scale, s), name
        assert cut_seen > 0 if tp > 1 else cut_seen == 0
        for i, block in enumerate(list(part.layers) + list(part.mtp)):
            mine, ref = block.ffn.packed, (list(whole.layers) + list(whole.mtp))[i].ffn.packed
            lo, n = layout.experts.start, len(layout.experts)
            assert mine.num_experts == n
            for field in ("w13", "w13_scale", "w2", "w2_scale"):
                assert torch.equal(getattr(mine, field), getattr(ref, field)[lo:lo + n]), (i, field)
            assert block.mhc is not None  # mHC kernels prepared at finalize
