"""Launch fusions of the decode MoE (dsv4.kernels.moe_gemv_fused, flags FUSE_Z_QUANT / FUSE_COMBINE /
FUSE_X_QUANT of dsv4.kernels.moe_gemv): bit for bit the separate launches' results, on poisoned outputs, with
split-K 1 and 2, duplicate experts per token, other ranks' pairs, tokens with no pair on this rank, and a
second call on the same (reset) arrival counters. Both paths use the same float conversions, so the
comparisons are exact under TRITON_INTERPRET=1 too."""

from __future__ import annotations

import os

import pytest
import torch

DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
LIMIT = 10.0
FLAGS = ("FUSE_Z_QUANT", "FUSE_COMBINE", "FUSE_X_QUANT")
UNFUSED = dict.fromkeys(FLAGS, False)
FUSED = dict(FUSE_Z_QUANT=True, FUSE_COMBINE=True, FUSE_X_QUANT=False)  # the two launch fusions (opt-in)
ALL = dict.fromkeys(FLAGS, True)


def _experts(e: int, d: int, i: int, gen: torch.Generator):
    from dsv4.kernels.moe import ExpertWeights, finalize_experts

    def packed(n, kk):
        return torch.randint(0, 256, (e, n, kk // 2), generator=gen, device=DEV, dtype=torch.uint8).view(torch.int8)

    def scales(n, kk):  # E8M0 around 2^-5: gate/up often past the clamp
        return torch.randint(119, 125, (e, n, kk // 32), generator=gen, device=DEV, dtype=torch.uint8)

    return finalize_experts(ExpertWeights("mxfp4", packed(i, d), scales(i, d), packed(d, i), scales(d, i),
                                          packed(i, d), scales(i, d)))


def _routing(m: int, e: int, k: int, kind: str, gen: torch.Generator):
    """topk: distinct experts; dup: hash-like ids with repeated experts in a token; ep: expert parallel, about
    a third of the slots another rank's (-1 or ids >= E), token 0 with none on this rank."""
    if kind == "dup":
        ids = torch.randint(0, e, (m, k), generator=gen, device=DEV)
        ids[:, 1] = ids[:, 0]
        ids[:, k - 1] = ids[:, 2]
    else:
        ids = torch.rand(m, e, generator=gen, device=DEV).topk(k, dim=1).indices
    if kind == "ep":
        drop = torch.rand(m, k, generator=gen, device=DEV) < 0.35
        ids = torch.where(drop, torch.where(ids % 2 == 0, -1, ids + e), ids)
        ids[0] = -1
        ids[0, 1] = e + 5
    w = torch.rand(m, k, generator=gen, device=DEV) * 1.5 + 0.1
    return ids, w


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.equal(_bits(a), _bits(b)), f"{what}: not bit-identical"


def _counters_zero(device) -> None:
    from dsv4.kernels._triton import arrival_counters
    for user in ("moe_gemv split-K", "moe_gemv z-quant", "moe_gemv combine"):
        assert not bool(arrival_counters(user, device, 1).any()), f"{user}: counters not reset"


@pytest.fixture
def flags(monkeypatch):
    from dsv4.kernels import moe_gemv

    def set_flags(values: dict) -> None:
        for name, value in values.items():
            monkeypatch.setattr(moe_gemv, name, value)

    return set_flags


# (m, routing): M = 1, 2, 8 with each routing kind once
CASES = [(1, "topk"), (2, "dup"), (8, "ep")]


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("m,kind", CASES)
def test_glu_stage_fusions_bit_identical(m, kind, split, flags):
    """FP8 z (codes + scales) of the bn 64 GLU: z re-quantised in the GLU (and x quantised there) = the separate
    quantisation launches; other ranks' rows keep their poison; a second call reuses the counters."""
    from dsv4.kernels.moe_gemv import mma_glu_stage

    e, d, i, k = 8, 256, 256, 6
    gen = torch.Generator(DEV).manual_seed(100 * m + split)
    packed = _experts(e, d, i, gen)
    ids, w = _routing(m, e, k, kind, gen)
    flat_ids, flat_w = ids.reshape(-1).contiguous(), w.reshape(-1).float().contiguous()

    mine = (flat_ids >= 0) & (flat_ids < e)

    def run(x, values):
        flags(values)
        zq = torch.full((m * k, i), float("nan"), dtype=torch.float16, device=DEV)
        zs = torch.full((m * k, i // 128), float("nan"), dtype=torch.float32, device=DEV)
        mma_glu_stage(x, flat_ids, flat_w, packed, LIMIT, k, zq, zs, bn=64, unroll=1, split=split)
        _counters_zero(zq.device)
        return zq, zs

    for call in range(2):  # the second call: fresh x, the counters the first left
        x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
        ref = run(x, UNFUSED)
        assert bool(ref[0][mine].isfinite().all()) and bool(ref[0][~mine].isnan().all())
        for name, values in (("z-quant", FUSED), ("z+x quant", ALL)):
            got = run(x, values)  # NaN-filled: an unwritten routed element differs from ref's finite one
            _same(got[0], ref[0], f"{name} zq call {call}")
            _same(got[1], ref[1], f"{name} zs call {call}")


SHARED = ("none", "tensor", "join")


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("m,kind,shared,dtype", [(1, "topk", "tensor", "bf16"), (2, "dup", "join", "bf16"),
                                                 (8, "ep", "none", "fp32"), (2, "ep", "tensor", "bf16")])
def test_combine_fusion_bit_identical(m, kind, shared, dtype, split, flags):
    """moe_gemv(out=...) with the combine in the down kernel (and the other fusions) = the separate launches,
    bit for bit, on a poisoned out; split-K of both kernels; the second call reuses the counters."""
    from dsv4.kernels.moe_gemv import moe_gemv

    e, d, i, k = 8, 256, 256, 6
    gen = torch.Generator(DEV).manual_seed(7 * m + split + len(kind))
    packed = _experts(e, d, i, gen)
    ids, w = _routing(m, e, k, kind, gen)
    out_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    launch = dict(bn=64, method="mma", unroll=1, split=split, split_down=split)

    def run(x, sh, values, fill):
        flags(values)
        out = torch.full((m, d), fill, dtype=out_dtype, device=DEV)
        arg = (lambda: sh) if shared == "join" else sh
        assert moe_gemv(x, ids, w, packed, LIMIT, out=out, shared=arg, **launch) is out
        _counters_zero(out.device)
        return out

    for call in range(2):
        x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
        sh = None if shared == "none" else torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
        ref = run(x, sh, UNFUSED, float("nan"))
        assert bool(torch.isfinite(ref).all())
        for name, values in (("fused", FUSED), ("all fused", ALL)):
            _same(run(x, sh, values, 3e38 if dtype == "fp32" else float("nan")), ref, f"{name} call {call}")


def test_fused_moe_decode_config(flags):
    """fused_moe at its decode config (bn 64, 2 K blocks per step, GLU split 2) with a shared-expert join:
    the fused launches give the unfused bits."""
    from dsv4.kernels.moe import fused_moe, pick_moe_config

    e, d, i, k, m = 16, 512, 256, 6, 1
    cfg = pick_moe_config(m * k, 256)
    assert cfg.gemv == 64 and cfg.gemv_mma and cfg.gemv_split == 2
    gen = torch.Generator(DEV).manual_seed(4242)
    packed = _experts(e, d, i, gen)
    ids, w = _routing(m, e, k, "topk", gen)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    sh = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
    joined = []

    def join():
        joined.append(1)
        return sh

    flags(UNFUSED)
    ref = fused_moe(x, ids, w, packed, LIMIT, shared=join, config=cfg)
    for values in (FUSED, ALL):
        flags(values)
        _same(fused_moe(x, ids, w, packed, LIMIT, shared=join, config=cfg), ref, str(values))
    assert len(joined) == 3
    _counters_zero(x.device)


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs")
@pytest.mark.parametrize("m", [1, 8])
def test_fused_decode_graph_replays(m, graph_replays):
    """A captured fused_moe (all fusions, with PDL where on) replays the unfused eager bits for changing inputs:
    the last arrivers leave every counter at zero for the next replay."""
    from dsv4.kernels import moe_gemv
    from dsv4.kernels.moe import fused_moe

    e, d, i, k = 32, 1024, 512, 6
    gen = torch.Generator(DEV).manual_seed(m + 5150)
    packed = _experts(e, d, i, gen)
    ids, w = _routing(m, e, k, "topk", gen)
    sh = torch.randn(m, d, generator=gen, device=DEV).to(torch.bfloat16)
    xs = [(torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16) for _ in range(3)]
    old = {name: getattr(moe_gemv, name) for name in FLAGS}
    try:
        for name in FLAGS:
            setattr(moe_gemv, name, False)
        expected = [fused_moe(x, ids, w, packed, LIMIT, shared=sh) for x in xs]
        for name in FLAGS:
            setattr(moe_gemv, name, True)
        static_x = xs[0].clone()
        fused_moe(static_x, ids, w, packed, LIMIT, shared=sh)  # counters allocated before the capture
        torch.cuda.synchronize()
        graph_replays(lambda x: fused_moe(x, ids, w, packed, LIMIT, shared=sh), static_x, xs, expected,
                      what=f"fused m={m}")
    finally:
        for name, value in old.items():
            setattr(moe_gemv, name, value)
