"""An expert-parallel rank's routed-MoE launch shape (dsv4.distributed.moe_comm): the rank's fused call gets all
T x k pairs, the other ranks' marked -1, so the shape rule must see the rank's expected share of them. The property:
a rank holding E / ep experts picks what one GPU picks for the whole model at the same tokens (the same pairs per
expert), at every batch size the rule distinguishes; and `_local_experts` hands the kernel that shape with the ids
mapped to the rank's experts."""
from __future__ import annotations

import types

import pytest
import torch

from dsv4.distributed import moe_comm
from dsv4.kernels.moe_config import pick_moe_config

TOP_K = 6


@pytest.mark.parametrize("experts,hidden", [(256, 4096), (384, 7168)])
@pytest.mark.parametrize("ep", [2, 4, 8])
@pytest.mark.parametrize("tokens", [16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192, 16384])
def test_rank_picks_what_one_gpu_picks_at_the_same_density(experts, hidden, ep, tokens):
    one_gpu = pick_moe_config(tokens * TOP_K, experts, hidden=hidden)
    assert moe_comm.rank_moe_config(tokens * TOP_K, experts // ep, experts, hidden) == one_gpu


def test_counting_every_pair_would_pick_larger_kernels():
    """Why the share: at Flash B = 128 on 2 ranks, all 768 pairs over 128 experts look like 6 per expert (the wide
    kernel's tiles), while the rank computes ≈ 384 of them, 3 per expert (one GPU's B = 128: the per-pair kernels)."""
    assert not pick_moe_config(768, 128).gemv
    assert moe_comm.rank_moe_config(768, 128, 256).gemv


def test_local_experts_maps_ids_and_passes_the_rank_shape(monkeypatch):
    import dsv4.kernels.moe as kmoe

    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    e, ep, t, d = 64, 4, 37, 32
    rank = int(torch.randint(0, ep, (), generator=gen))
    per = e // ep
    ids = torch.rand(t, e, generator=gen).topk(TOP_K, dim=1).indices
    weights = torch.rand(t, TOP_K, generator=gen)
    xq = torch.randn(t, d, generator=gen)
    seen = {}

    def fake_fused_moe(x, local, w, packed, limit, act, out_dtype, config):
        seen.update(local=local, config=config, x=x, w=w, out_dtype=out_dtype)
        return torch.zeros(x.shape, dtype=out_dtype)

    monkeypatch.setattr(kmoe, "fused_moe", fake_fused_moe)
    owned = range(rank * per, (rank + 1) * per)
    moe = types.SimpleNamespace(packed=types.SimpleNamespace(hidden=d), limit=10.0,
                                gate=types.SimpleNamespace(n_experts=e), layout=types.SimpleNamespace(experts=owned))
    moe_comm._local_experts(moe, xq, weights, ids, torch.float32)
    want = [[i - rank * per if rank * per <= i < (rank + 1) * per else -1 for i in row] for row in ids.tolist()]
    assert seen["local"].tolist() == want and seen["local"].dtype == torch.int32
    assert seen["x"] is xq and seen["w"] is weights and seen["out_dtype"] == torch.float32
    assert seen["config"] == pick_moe_config(round(t * TOP_K / ep), per, hidden=d)
