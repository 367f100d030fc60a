"""The chained persistent decode MoE (dsv4.kernels.moe_glu_decode.CHAIN: the GLU, its finish by each z block's last
arriving partial, and the down in one launch) against the same kernels in three launches: the same output bits (the
same sums in the same order), its counters zero again after every launch, and in a CUDA graph replayed over fresh
routings. Hopper only (TMA, wgmma)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_moe_gemv_mma import LIMIT, _experts, _routing

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("the Gluon decode kernels need a Hopper GPU", allow_module_level=True)

DEV = "cuda"


def _moe(x, ids, w, packed, dtype):
    """The decode MoE call through moe_gemv (method "mma", one pair per program) into a NaN-filled output."""
    from dsv4.kernels.moe_gemv import moe_gemv
    out = torch.full(x.shape, float("nan"), dtype=dtype, device=DEV)
    return moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma", out=out)


def _counters_zero(pairs: int, inter: int) -> bool:
    from dsv4.kernels._triton import arrival_counters
    return not bool(arrival_counters("moe_glu_decode chain", torch.device(DEV), pairs * (inter // 128) + pairs + 1)
                    .any())


@pytest.mark.parametrize("d,i,m,other_ranks", [(4096, 2048, 1, False), (2048, 1024, 3, False),
                                                (2048, 1024, 9, True), (2048, 1024, 2, True)])
def test_chain_gives_the_three_launches_bits(d, i, m, other_ranks, close_bf16, monkeypatch):
    """Flash's expert shape at one token, and a half-size one at 2-9 tokens with other ranks' pairs (the fp32
    expert-parallel partial): chained == unchained bit for bit, both close to the reference; called twice with
    fresh routings (the counters reset themselves)."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import finalize_experts, fused_moe_ref

    e, k = 16, 6
    gen = torch.Generator(DEV).manual_seed(d + 7 * m)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    dtype = torch.float32 if other_ranks else torch.bfloat16
    for call in range(2):
        x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
        ids, w = _routing(m, e, k, gen, other_ranks=other_ranks)
        monkeypatch.setattr(moe_glu_decode, "CHAIN", False)
        off = _moe(x, ids, w, packed, dtype)
        monkeypatch.setattr(moe_glu_decode, "CHAIN", True)
        assert moe_glu_decode.chains(packed, x, None)
        on = _moe(x, ids, w, packed, dtype)
        torch.cuda.synchronize()
        assert _counters_zero(ids.numel(), i), f"call {call}: counters left non-zero"
        assert torch.equal(on, off), (f"call {call}: {float((on != off).float().mean()):.4f} of the outputs differ "
                                      "from the three launches'")
        close_bf16(on, fused_moe_ref(x, ids, w, experts, out_dtype=dtype), rel=1e-2, what=f"chain m={m} vs reference")


def test_chain_in_a_cuda_graph(monkeypatch):
    """One chained call captured (after an eager one of its shape: the counters exist), replayed over three fresh
    routings and inputs: each replay's output is the three launches' eager output for them."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import finalize_experts

    e, d, i, k, m = 16, 2048, 1024, 6, 4
    gen = torch.Generator(DEV).manual_seed(5)
    packed = finalize_experts(_experts(e, d, i, gen))
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen)
    monkeypatch.setattr(moe_glu_decode, "CHAIN", True)
    _moe(x, ids, w, packed, torch.bfloat16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _moe(x, ids, w, packed, torch.bfloat16)
    for _ in range(3):
        x.copy_((torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16))
        new_ids, new_w = _routing(m, e, k, gen)
        ids.copy_(new_ids)
        w.copy_(new_w)
        graph.replay()
        monkeypatch.setattr(moe_glu_decode, "CHAIN", False)
        want = _moe(x, ids, w, packed, torch.bfloat16)
        monkeypatch.setattr(moe_glu_decode, "CHAIN", True)
        assert torch.equal(out, want), f"{float((out != want).float().mean()):.4f} of a replay's outputs differ"
    assert _counters_zero(ids.numel(), i)
