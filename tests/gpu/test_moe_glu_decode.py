"""The persistent Gluon decode GLU (dsv4.kernels.moe_glu_decode) against the Triton method-"mma" GLU it replaces and
the float reference: the FP8 z rows it writes, for K splits, ring depths and expert-parallel pairs; and the whole MoE
call with it on. Hopper only (TMA, wgmma)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.test_moe_gemv_mma import LIMIT, _act_order, _experts, _glu_ref, _routing

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("the Gluon decode GLU needs a Hopper GPU", allow_module_level=True)

DEV = "cuda"


def _z(zq: torch.Tensor, zs: torch.Tensor, p: int, i: int) -> torch.Tensor:
    """Pair p's dequantised z [i] from the method-"mma" layout (f16 codes in `_act_pos` order + scales)."""
    q = torch.empty(i, dtype=torch.float32, device=DEV)
    q[_act_order(i).to(DEV)] = zq[p].float()
    return q * zs[p].repeat_interleave(128)


def _stage(fn, x, ids, w, packed, k, i, **kw):
    """Run one GLU stage into NaN-filled zq / zs."""
    pairs = ids.numel()
    zq = torch.full((pairs, i), float("nan"), dtype=torch.float16, device=DEV)
    zs = torch.full((pairs, i // 128), float("nan"), dtype=torch.float32, device=DEV)
    fn(x, ids.reshape(-1).contiguous(), w.reshape(-1).float().contiguous(), packed, LIMIT, k, zq, zs, **kw)
    return zq, zs


@pytest.mark.parametrize("m,split,stages,consumers", [(1, 4, 6, 1), (3, 2, 3, 1), (1, 4, 6, 2), (2, 1, 2, 2),
                                                      (3, 4, 6, 2), (2, 2, 3, 1)])
def test_glu_decode_matches_triton_glu_and_reference(m, split, stages, consumers, close_bf16, monkeypatch):
    """z of every routed pair equals the Triton GLU's up to fp32 summation order (an FP8 step of z at most where a
    1-ulp gate / up difference crosses a rounding boundary) and the reference's; other ranks' rows stay NaN."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_gemv import mma_glu_stage

    e, d, i, k = 8, 2048, 256, 6
    gen = torch.Generator(DEV).manual_seed(m * 7 + split + stages)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)

    monkeypatch.setattr(moe_glu_decode, "ENABLED", False)
    monkeypatch.setattr(moe_glu_decode, "CONSUMERS", consumers)
    zq_t, zs_t = _stage(mma_glu_stage, x, ids, w, packed, k, i, bn=64)

    def gluon(x, flat_ids, tw, packed, limit, top_k, zq, zs):
        xq = torch.empty((m, d), dtype=torch.float16, device=DEV)
        sx = torch.empty((m, d // 128), dtype=torch.float32, device=DEV)
        from dsv4.kernels.moe_gemv import _quant16_kernel
        _quant16_kernel[(m, d // 128)](x, xq, sx, flat_ids, e, x.stride(0), xq.stride(0), sx.stride(0),
                                       CHECK_IDS=False, num_warps=1)
        moe_glu_decode.glu_decode(xq, sx, flat_ids, tw, packed, limit, top_k, zq, zs, split=split, stages=stages)

    zq_g, zs_g = _stage(gluon, x, ids, w, packed, k, i)
    same = 0
    for p, z_ref in enumerate(_glu_ref(x, ids, w, experts)):
        if z_ref is None:
            assert bool(zq_g[p].isnan().all()) and bool(zs_g[p].isnan().all()), f"pair {p} of another rank written"
            continue
        got, triton_z = _z(zq_g, zs_g, p, i), _z(zq_t, zs_t, p, i)
        same += int(torch.equal(got, triton_z))
        close_bf16(got[None], triton_z[None], rel=1e-2, what=f"pair {p} vs the Triton GLU")
        from dsv4.quant.fp8 import quantize_act
        q_ref, s_ref = quantize_act(z_ref[None])
        close_bf16(got[None], (q_ref.float()[0] * s_ref[0].repeat_interleave(128))[None], rel=1e-2,
                   what=f"pair {p} vs the reference")
    print(f"m={m} split={split} stages={stages} consumers={consumers}: {same} of "
          f"{int((ids >= 0).sum())} pairs' z bit-identical")


def test_glu_decode_flash_shape_in_fused_moe(close_bf16, monkeypatch):
    """Flash's expert shape (D 4096, I 2048) through fused_moe at one and two tokens, on vs off: the combined
    outputs agree to bf16 rounding (the GLU runs many units per program: the ring crosses units)."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import fused_moe, finalize_experts, fused_moe_ref

    e, d, i, k = 16, 4096, 2048, 6
    gen = torch.Generator(DEV).manual_seed(11)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    for m, consumers in ((1, 1), (2, 1), (1, 2)):
        monkeypatch.setattr(moe_glu_decode, "CONSUMERS", consumers)
        x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
        ids, w = _routing(m, e, k, gen)
        monkeypatch.setattr(moe_glu_decode, "ENABLED", False)
        off = fused_moe(x, ids, w, packed)
        monkeypatch.setattr(moe_glu_decode, "ENABLED", True)
        assert moe_glu_decode.applies(packed, x, None)
        on = fused_moe(x, ids, w, packed)
        close_bf16(on, off, rel=1e-2, what=f"fused_moe m={m} consumers={consumers}, Gluon GLU vs Triton GLU")
        close_bf16(on, fused_moe_ref(x, ids, w, experts), rel=1e-2, what=f"fused_moe m={m} vs reference")


@pytest.mark.parametrize("m,consumers,i", [(1, 2, 2048), (3, 2, 2048), (2, 1, 2048), (1, 2, 1536), (3, 2, 1536)])
def test_down_decode_in_moe_gemv(m, consumers, i, close_bf16, monkeypatch):
    """The persistent down GEMV (partials summed in the combine) against the Triton down: the combined MoE output
    (bf16, and the fp32 expert-parallel partial with other ranks' pairs) close to it and to the reference. Inter 1536
    (12 K blocks, as Pro's 3072 = 24: not a power of two in one range) takes DOWN_ODD_SPLIT's 3 ranges."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import finalize_experts, fused_moe_ref
    from dsv4.kernels.moe_gemv import moe_gemv

    e, d, k = 8, 2048, 6
    gen = torch.Generator(DEV).manual_seed(m * 5 + consumers)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    monkeypatch.setattr(moe_glu_decode, "CONSUMERS", consumers)
    monkeypatch.setattr(moe_glu_decode, "DOWN_ODD_SPLIT", True)
    assert moe_glu_decode._split(packed, False) == (3 if i == 1536 else moe_glu_decode.DOWN_SPLIT)
    for dtype, other_ranks in ((torch.bfloat16, False), (torch.float32, True)):
        ids, w = _routing(m, e, k, gen, other_ranks=other_ranks)
        outs = []
        for on in (False, True):
            monkeypatch.setattr(moe_glu_decode, "DOWN_ENABLED", on)
            assert moe_glu_decode.applies(packed, x, None, down=True) == on
            out = torch.full((m, d), float("nan"), dtype=dtype, device=DEV)
            outs.append(moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma", out=out))
        same = float((outs[0] == outs[1]).float().mean())
        print(f"m={m} consumers={consumers} i={i} {dtype}: {same:.4f} of the outputs bit-identical "
              "to the Triton down's")
        close_bf16(outs[1], outs[0], rel=1e-2, what=f"down m={m} {dtype} vs the Triton down")
        close_bf16(outs[1], fused_moe_ref(x, ids, w, experts, out_dtype=dtype), rel=1e-2, what=f"down m={m} {dtype}")


@pytest.mark.parametrize("m,flag,bound", [(1, "DOWN_BOUND", (160, 200)), (3, "DOWN_BOUND", (128, 136)),
                                          (1, "GLU_BOUND", (136, 184)), (2, "GLU_BOUND", (160, 200))])
def test_register_bound_gives_the_same_bits(m, flag, bound, monkeypatch):
    """GLU_BOUND / DOWN_BOUND (a persistent launch at fewer registers per thread, so that a small CTA fits beside
    it): the same instructions' order of sums, so the MoE output is bit-identical to the launch under Triton's
    bound (None), for bf16 and for the fp32 expert-parallel partial. A pair that would starve the first consumer is
    refused."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_gemv import moe_gemv

    e, d, i, k = 8, 2048, 2048, 6
    gen = torch.Generator(DEV).manual_seed(m * 11 + bound[0])
    packed = finalize_experts(_experts(e, d, i, gen))
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    monkeypatch.setattr(moe_glu_decode, "DOWN_ENABLED", True)
    assert moe_glu_decode.applies(packed, x, None) and moe_glu_decode.applies(packed, x, None, down=True)
    for dtype, other_ranks in ((torch.bfloat16, False), (torch.float32, True)):
        ids, w = _routing(m, e, k, gen, other_ranks=other_ranks)
        outs = []
        for value in (None, bound):
            monkeypatch.setattr(moe_glu_decode, flag, value)
            out = torch.full((m, d), float("nan"), dtype=dtype, device=DEV)
            outs.append(moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma", out=out))
        assert not outs[0].isnan().any()
        assert torch.equal(outs[1], outs[0]), f"m={m} {flag}={bound} {dtype}: the outputs differ"
    monkeypatch.setattr(moe_glu_decode, flag, (128, 200))  # the first consumer would get 144
    with pytest.raises(ValueError, match="register bound"):
        moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma", out=torch.empty((m, d), dtype=dtype, device=DEV))


@pytest.mark.parametrize("m", [1, 3, 8])
def test_finish_in_down_gives_the_same_bits(m, monkeypatch):
    """FINISH_IN_DOWN (the down's consumers finish z from the GLU's partials, no finish launch): the zq / zs rows of
    the routed pairs equal the finish kernel's bit for bit (other ranks' rows stay unwritten), the down's partials
    too, and so does the whole MoE call (bf16, and the fp32 expert-parallel partial)."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_gemv import _quant16_kernel, moe_gemv

    e, d, i, k = 8, 2048, 2048, 6
    gen = torch.Generator(DEV).manual_seed(m * 13 + 5)
    packed = finalize_experts(_experts(e, d, i, gen))
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    monkeypatch.setattr(moe_glu_decode, "DOWN_ENABLED", True)
    assert moe_glu_decode.applies(packed, x, None) and moe_glu_decode.applies(packed, x, None, down=True)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    flat_ids, tw = ids.reshape(-1).contiguous(), w.reshape(-1).float().contiguous()
    xq = torch.empty((m, d), dtype=torch.float16, device=DEV)
    sx = torch.empty((m, d // 128), dtype=torch.float32, device=DEV)
    _quant16_kernel[(m, d // 128)](x, xq, sx, flat_ids, e, x.stride(0), xq.stride(0), sx.stride(0), CHECK_IDS=False,
                                   num_warps=1)
    zs_, ys = [], []
    for fold in (False, True):
        zq = torch.full((ids.numel(), i), float("nan"), dtype=torch.float16, device=DEV)
        zs = torch.full((ids.numel(), i // 128), float("nan"), dtype=torch.float32, device=DEV)
        part = moe_glu_decode.glu_decode(xq, sx, flat_ids, tw, packed, LIMIT, k, zq, zs, finish=not fold)
        assert (part is not None) == fold
        ys.append(moe_glu_decode.down_decode(zq, zs, flat_ids, packed, fin=(part, tw, LIMIT) if fold else None))
        zs_.append((zq, zs))
    mine = (flat_ids >= 0) & (flat_ids < e)
    assert 0 < int(mine.sum()) < flat_ids.numel()
    for a, b in zip(zs_[0], zs_[1]):
        assert torch.equal(a[mine], b[mine]), f"m={m}: z differs from the finish kernel's"
        assert b[~mine].isnan().all(), f"m={m}: other ranks' z rows were written"
    assert torch.equal(ys[0][:, mine], ys[1][:, mine]), f"m={m}: the down's partials differ"
    for dtype, other_ranks in ((torch.bfloat16, False), (torch.float32, True)):
        ids, w = _routing(m, e, k, gen, other_ranks=other_ranks)
        outs = []
        for fold in (False, True):
            monkeypatch.setattr(moe_glu_decode, "FINISH_IN_DOWN", fold)
            out = torch.full((m, d), float("nan"), dtype=dtype, device=DEV)
            outs.append(moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma", out=out))
        assert not outs[0].isnan().any()
        assert torch.equal(outs[1], outs[0]), f"m={m} {dtype}: the MoE call differs with FINISH_IN_DOWN"


def test_glu_decode_odd_split_in_fused_moe(close_bf16, monkeypatch):
    """A hidden size SPLIT does not fit (3584 = 28 K blocks, as Pro's 7168 = 56: 7 K ranges) through fused_moe with
    ODD_SPLIT on vs off (off: the Triton GLU takes it): outputs agree to bf16 rounding and with the reference."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import fused_moe, finalize_experts, fused_moe_ref

    e, d, i, k = 8, 3584, 512, 6
    gen = torch.Generator(DEV).manual_seed(13)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    monkeypatch.setattr(moe_glu_decode, "ODD_SPLIT", False)
    assert moe_glu_decode._split(packed, True) is None
    monkeypatch.setattr(moe_glu_decode, "ODD_SPLIT", True)
    assert moe_glu_decode._split(packed, True) == 7
    for m in (1, 3):
        x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
        ids, w = _routing(m, e, k, gen)
        assert moe_glu_decode.applies(packed, x, None)
        on = fused_moe(x, ids, w, packed)
        monkeypatch.setattr(moe_glu_decode, "ODD_SPLIT", False)
        assert not moe_glu_decode.applies(packed, x, None)
        off = fused_moe(x, ids, w, packed)
        monkeypatch.setattr(moe_glu_decode, "ODD_SPLIT", True)
        close_bf16(on, off, rel=1e-2, what=f"fused_moe m={m}, 7 K ranges vs the Triton GLU")
        close_bf16(on, fused_moe_ref(x, ids, w, experts), rel=1e-2, what=f"fused_moe m={m} vs reference")


@pytest.mark.parametrize("m,other_ranks", [(3, False), (9, True)])
def test_unit_runs_give_the_same_bits(m, other_ranks, monkeypatch):
    """The GLU's units in runs of 4 or 8 row tiles of one pair (`UNIT_RUN`; `LONG_UNIT_RUN` from
    `LONG_UNIT_RUN_FROM_PAIRS` = 48 pairs, here 9 tokens' 54) give every pair's z codes and scales of unit-by-unit order
    (each unit keeps its own MMA chain, whatever the order); other ranks' pairs stay unwritten; runs that do not
    divide a matrix's row tiles are refused."""
    from dsv4.kernels import moe_glu_decode
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_gemv import _quant16_kernel

    e, d, i, k = 8, 2048, 512, 6  # (8 row tiles of 64 per matrix)
    gen = torch.Generator(DEV).manual_seed(m + 90)
    packed = finalize_experts(_experts(e, d, i, gen))
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=other_ranks)
    flat = ids.reshape(-1).contiguous()

    def glu(x, flat_ids, tw, packed, limit, top_k, zq, zs):
        xq = torch.empty((m, d), dtype=torch.float16, device=DEV)
        sx = torch.empty((m, d // 128), dtype=torch.float32, device=DEV)
        _quant16_kernel[(m, d // 128)](x, xq, sx, flat_ids, e, x.stride(0), xq.stride(0), sx.stride(0),
                                       CHECK_IDS=False, num_warps=1)
        moe_glu_decode.glu_decode(xq, sx, flat_ids, tw, packed, limit, top_k, zq, zs)

    monkeypatch.setattr(moe_glu_decode, "LONG_UNIT_RUN_FROM_PAIRS", 0)
    one = _stage(glu, x, ids, w, packed, k, i)
    mine = (flat >= 0) & (flat < e)
    assert bool(mine.any()) and bool(torch.isfinite(one[0][mine]).all())
    for run, long_from in ((4, 0), (1, 48)):  # (runs of 4; LONG_UNIT_RUN = 8 from 48 pairs)
        monkeypatch.setattr(moe_glu_decode, "UNIT_RUN", run)
        monkeypatch.setattr(moe_glu_decode, "LONG_UNIT_RUN_FROM_PAIRS", long_from)
        assert moe_glu_decode._unit_run(flat.numel(), i // 64) == (8 if 0 < long_from <= flat.numel() else run)
        again = _stage(glu, x, ids, w, packed, k, i)
        for a, b in zip(one, again):
            assert torch.equal(a[mine], b[mine]) and bool(b[~mine].isnan().all()), (run, long_from)
    monkeypatch.setattr(moe_glu_decode, "UNIT_RUN", 3)
    with pytest.raises(ValueError, match="runs of 3 row tiles"):
        moe_glu_decode._unit_run(6, i // 64)
