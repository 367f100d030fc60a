"""method="mma" of the per-pair MXFP4 MoE (dsv4.kernels.moe_gemv): tensor-core group sums against the torch
reference and the CUDA-core path, each stage (GLU, down) against its own reference, and the rows of other
ranks' pairs left unwritten. Under TRITON_INTERPRET=1 the interpreter's float casts are made to round like
the GPU (its own truncate), see `_gpu_like_casts`."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

# "cpu" only for checking the tests themselves under TRITON_INTERPRET=1 (slow; use -k)
DEV = os.environ.get("DSV4_TEST_DEVICE", "cuda")
LIMIT = 10.0

# launch shapes (bn, num_warps, unroll, dot_blocks, num_stages): every code path of the kernels
SHAPES = {
    "bn64": (64, 4, 2, 1, 3),
    "bn64_u4_kd2": (64, 4, 4, 2, 2),
    "bn64_u1_s4": (64, 4, 1, 1, 4),
    "bn128_w8": (128, 8, 2, 1, 3),  # z quantised in the GLU epilogue
    "bn128_u4_kd4": (128, 4, 4, 4, 2),
}


@pytest.fixture(autouse=True)
def _gpu_like_casts(monkeypatch):
    """Triton's interpreter truncates fp32 -> e4m3 / bf16 / f16 casts; the GPU rounds to nearest even (as the
    torch reference does). Route the interpreter's float casts through torch so that the CPU run checks the
    same numbers the GPU computes."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.runtime.interpreter as interp

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8e4nv": torch.float8_e4m3fn}
    original = interp._convert_float

    def convert(data, src_type, dst_type, rounding_mode):
        src, dst = dtypes.get(str(src_type)), dtypes.get(str(dst_type))
        if src is None or dst is None or rounding_mode not in (None, interp._ir.ROUNDING_MODE.RTNE):
            return original(data, src_type, dst_type, rounding_mode)
        ib, ob = src_type.primitive_bitwidth, dst_type.primitive_bitwidth
        raw = np.frombuffer(data.tobytes(), dtype=getattr(np, f"int{ib}")).copy()
        out = torch.from_numpy(raw).view(src).to(dst).view(getattr(torch, f"int{ob}")).numpy()
        return out.view(getattr(np, f"uint{ob}")).reshape(data.shape)

    monkeypatch.setattr(interp, "_convert_float", convert)


def _experts(e: int, d: int, i: int, gen: torch.Generator):
    from dsv4.kernels.moe import ExpertWeights

    def packed(n, kk):
        return torch.randint(0, 256, (e, n, kk // 2), generator=gen, device=DEV, dtype=torch.uint8).view(torch.int8)

    def scales(n, kk):  # E8M0 around 2^-5: |W| up to ~0.2, gate/up often past the clamp
        return torch.randint(119, 125, (e, n, kk // 32), generator=gen, device=DEV, dtype=torch.uint8)

    return ExpertWeights("mxfp4", packed(i, d), scales(i, d), packed(d, i), scales(d, i), packed(i, d), scales(i, d))


def _routing(m: int, e: int, k: int, gen: torch.Generator, other_ranks: bool = False):
    ids = torch.rand(m, e, generator=gen, device=DEV).topk(k, dim=1).indices
    if other_ranks:  # expert parallel: about a third of the pairs belong to another rank
        drop = torch.rand(m, k, generator=gen, device=DEV) < 0.35
        drop[0, 0] = True
        ids = torch.where(drop, -1, ids)
    w = torch.rand(m, k, generator=gen, device=DEV) * 1.5 + 0.1
    return ids, w


def _launch(shape: str) -> dict:
    bn, warps, unroll, kd, stages = SHAPES[shape]
    return dict(bn=bn, num_warps=warps, unroll=unroll, dot_blocks=kd, num_stages=stages)


def _act_order(k: int) -> torch.Tensor:
    """Element index (within the row) stored at each position of a method-"mma" activation row: per 128-block
    the low-nibble tile (positions 0..63) then the high one (64..127), position 16c + 8h + 2t + i of a tile
    holding weight byte 32h + 8t + 2c + i; byte j's low nibble is element j + 32 * (j >= 32), its high nibble
    the element 32 further (the repacked MXFP4 layout, dsv4.kernels.moe_layout)."""
    order = []
    for p in range(128):
        tile, q = divmod(p, 64)
        c, h, t, i = q // 16, (q // 8) % 2, (q // 2) % 4, q % 2
        byte = 32 * h + 8 * t + 2 * c + i
        order.append(byte + 32 * (byte >= 32) + 32 * tile)
    assert sorted(order) == list(range(128))
    base = torch.tensor(order)
    return torch.cat([kb * 128 + base for kb in range(k // 128)])


def _glu_ref(x, ids, w, experts):
    """Per pair (rows of ids outside [0, E): None): the reference z = bf16(w * silu(min(gate, L)) *
    clamp(up, -L, L)) with gate/up the bf16 FP8-activation GEMMs of `fused_moe_ref`."""
    from dsv4.kernels.moe import _expert_weight_f32, _linear_ref

    m, k = ids.shape
    rows = []
    for p in range(m * k):
        t, s = divmod(p, k)
        ex = int(ids[t, s])
        if not 0 <= ex < experts.num_experts:
            rows.append(None)
            continue
        w1 = _expert_weight_f32(experts.w1[ex], experts.w1_scale[ex], "mxfp4")
        w3 = _expert_weight_f32(experts.w3[ex], experts.w3_scale[ex], "mxfp4")
        gate = _linear_ref(x[t:t + 1], w1, "fp8").float().clamp(max=LIMIT)
        up = _linear_ref(x[t:t + 1], w3, "fp8").float().clamp(-LIMIT, LIMIT)
        rows.append((F.silu(gate) * up * w[t, s].float()).to(torch.bfloat16)[0])
    return rows


@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_mma_moe_matches_reference(shape, m, poison, close_bf16):
    """fused_moe with MoEConfig(gemv_mma=True) against fused_moe_ref (and its pair rows against the CUDA-core
    path's): W4A8 in the reference's sense, one bf16 row per pair, fp32 combine."""
    from dsv4.kernels.moe import MoEConfig, finalize_experts, fused_moe, fused_moe_ref
    from dsv4.kernels.moe_gemv import moe_gemv

    e, d, i, k = 16, 512, 128, 6
    gen = torch.Generator(DEV).manual_seed(m * 31 + len(shape))
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen)
    launch = _launch(shape)
    cfg = MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=launch["bn"], gemv_mma=True,
                    warps1=launch["num_warps"], gemv_unroll=launch["unroll"], gemv_dot_blocks=launch["dot_blocks"],
                    gemv_stages=launch["num_stages"])
    poison()
    y = fused_moe(x, ids, w, packed, config=cfg)
    close_bf16(y, fused_moe_ref(x, ids, w, experts), rel=1e-2, what=f"mma {shape} m={m}")
    poison()
    rows = moe_gemv(x, ids, w, packed, LIMIT, method="mma", **launch)
    cuda_rows = moe_gemv(x, ids, w, packed, LIMIT, bn=32, method="cuda")
    # both paths re-quantise z to FP8: a 1-ulp difference in gate/up can move one z element by an e4m3 step
    close_bf16(rows, cuda_rows, rel=1e-2, what=f"mma rows vs CUDA-core rows {shape} m={m}")


@pytest.mark.parametrize("m", [1, 3, 8])
def test_mma_moe_expert_parallel(m, poison, close_bf16):
    """Pairs of other ranks (id -1) are skipped: the fp32 partial sum matches the reference's partial and the
    rows of this rank's pairs match the CUDA-core path's."""
    from dsv4.kernels.moe import MoEConfig, finalize_experts, fused_moe, fused_moe_ref
    from dsv4.kernels.moe_gemv import moe_gemv

    e, d, i, k = 16, 512, 128, 6
    gen = torch.Generator(DEV).manual_seed(m + 77)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    cfg = MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True)
    poison()
    y = fused_moe(x, ids, w, packed, out_dtype=torch.float32, config=cfg)
    assert y.dtype == torch.float32
    close_bf16(y, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2, what=f"partial m={m}")
    mine = (ids.reshape(-1) >= 0).nonzero()[:, 0]
    rows = moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma")[mine]
    close_bf16(rows, moe_gemv(x, ids, w, packed, LIMIT, bn=32)[mine], rel=1e-2, what=f"rows m={m}")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mma_glu_stage(shape, poison, close_bf16):
    """GEMM1 alone: the FP8 z it writes (f16 codes in the documented order + scales) dequantises to the
    reference z's FP8 quantisation; rows of other ranks' pairs keep the NaN they were filled with."""
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_gemv import mma_glu_stage
    from dsv4.quant.fp8 import quantize_act

    e, d, i, k, m = 8, 512, 256, 6, 3
    gen = torch.Generator(DEV).manual_seed(len(shape) + 5)
    experts = _experts(e, d, i, gen)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    pairs = m * k
    poison()
    zq = torch.full((pairs, i), float("nan"), dtype=torch.float16, device=DEV)
    zs = torch.full((pairs, i // 128), float("nan"), dtype=torch.float32, device=DEV)
    flat_ids = ids.reshape(-1).contiguous()
    mma_glu_stage(x, flat_ids, w.reshape(-1).float().contiguous(), finalize_experts(experts), LIMIT, k, zq, zs,
                  **_launch(shape))
    order = _act_order(i).to(DEV)
    for p, z_ref in enumerate(_glu_ref(x, ids, w, experts)):
        if z_ref is None:
            assert bool(zq[p].isnan().all()) and bool(zs[p].isnan().all()), f"pair {p} of another rank was written"
            continue
        q = torch.empty(i, dtype=torch.float32, device=DEV)
        q[order] = zq[p].float()
        got = q * zs[p].repeat_interleave(128)
        q_ref, s_ref = quantize_act(z_ref[None])
        want = q_ref.float()[0] * s_ref[0].repeat_interleave(128)
        close_bf16(got[None], want[None], rel=1e-2, what=f"{shape} z of pair {p}")


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mma_down_stage(shape, poison, close_bf16):
    """GEMM2 alone on FP8 z given in the documented order: y rows = bf16(dequant(z) . W2_e^T); rows of other
    ranks' pairs keep the NaN they were filled with."""
    from dsv4.kernels.moe import _expert_weight_f32, finalize_experts
    from dsv4.kernels.moe_gemv import mma_down_stage
    from dsv4.quant.fp8 import quantize_act

    e, d, i, k, m = 8, 256, 512, 6, 3
    gen = torch.Generator(DEV).manual_seed(len(shape) + 9)
    experts = _experts(e, d, i, gen)
    ids, _ = _routing(m, e, k, gen, other_ranks=True)
    pairs = m * k
    z = (torch.randn(pairs, i, generator=gen, device=DEV) * torch.rand(pairs, 1, generator=gen, device=DEV) * 4)
    q, s = quantize_act(z.to(torch.bfloat16))
    order = _act_order(i).to(DEV)
    zq = q.float()[:, order].to(torch.float16).contiguous()  # position j holds element order[j]
    poison()
    y = torch.full((pairs, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    mma_down_stage(zq, s.contiguous(), ids.reshape(-1).contiguous(), finalize_experts(experts), y, **_launch(shape))
    a = q.float() * s.repeat_interleave(128, dim=1)
    for p in range(pairs):
        ex = int(ids.reshape(-1)[p])
        if ex < 0:
            assert bool(y[p].isnan().all()), f"pair {p} of another rank was written"
            continue
        w2 = _expert_weight_f32(experts.w2[ex], experts.w2_scale[ex], "mxfp4")
        close_bf16(y[p:p + 1], (a[p:p + 1] @ w2.t()).to(torch.bfloat16), what=f"{shape} y of pair {p}")


def test_mma_subnormal_f16_weights(close_bf16):
    """Weights of magnitude 0.5 (code 1) are the f16 subnormal 2^-15 in the MMA: all-±0.5 experts must give
    the reference result (a tensor core flushing f16 subnormals would return zeros)."""
    from dsv4.kernels.moe import _expert_weight_f32, finalize_experts
    from dsv4.kernels.moe_gemv import mma_down_stage
    from dsv4.quant.fp8 import quantize_act

    e, d, i, k, m = 2, 128, 256, 2, 1
    gen = torch.Generator(DEV).manual_seed(11)
    experts = _experts(e, d, i, gen)
    halves = torch.tensor([0x11, 0x19, 0x91, 0x99], dtype=torch.uint8, device=DEV)
    pick = torch.randint(0, 4, experts.w2.shape, generator=gen, device=DEV)
    experts.w2 = halves[pick].view(torch.int8)
    assert bool(((experts.w2.view(torch.uint8) & 0x77) == 0x11).all())  # every weight code is ±0.5
    q, s = quantize_act((torch.randn(m * k, i, generator=gen, device=DEV) * 3).to(torch.bfloat16))
    zq = q.float()[:, _act_order(i).to(DEV)].to(torch.float16).contiguous()
    ids = torch.tensor([0, 1], device=DEV)
    y = torch.full((m * k, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    mma_down_stage(zq, s.contiguous(), ids, finalize_experts(experts), y)
    a = q.float() * s.repeat_interleave(128, dim=1)
    for p in range(m * k):
        w2 = _expert_weight_f32(experts.w2[p], experts.w2_scale[p], "mxfp4")
        close_bf16(y[p:p + 1], (a[p:p + 1] @ w2.t()).to(torch.bfloat16), what=f"±0.5 weights, pair {p}")


def test_mma_rejects_bad_launch_shapes():
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_gemv import moe_gemv

    gen = torch.Generator(DEV).manual_seed(3)
    packed = finalize_experts(_experts(2, 256, 256, gen))
    x = torch.randn(1, 256, generator=gen, device=DEV).to(torch.bfloat16)
    ids, w = _routing(1, 2, 2, gen)
    for bad in (dict(bn=32), dict(bn=64, unroll=3), dict(bn=64, unroll=2, dot_blocks=4)):
        with pytest.raises(ValueError, match="method='mma'"):
            moe_gemv(x, ids, w, packed, LIMIT, method="mma", **bad)
    with pytest.raises(ValueError, match="method"):
        moe_gemv(x, ids, w, packed, LIMIT, method="tensor")


# ----------------------------------------------------------------------------- split-K (split / split_down)

# K = 512 with one K block per loop step: 4 steps, so splits 2, 3 (ranges of 1, 1, 2 steps) and 4 all differ
SPLIT_SHAPES = {"bn64_u1": (64, 4, 1, 1, 3), "bn128_u1_w8": (128, 8, 1, 1, 3)}


def _counters_zero(device) -> bool:
    from dsv4.kernels._triton import arrival_counters
    return not bool(arrival_counters("moe_gemv split-K", device, 1).any())


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("shape", list(SPLIT_SHAPES))
def test_mma_glu_stage_split(shape, split, poison, close_bf16):
    """GLU split-K: z of each routed pair matches the reference's FP8 z and the unsplit launch's (same terms,
    another fp32 order); a repeated launch gives the same bits; rows of other ranks' pairs stay NaN; every
    arrival counter is back at zero."""
    from dsv4.kernels.moe import finalize_experts
    from dsv4.kernels.moe_gemv import mma_glu_stage
    from dsv4.quant.fp8 import quantize_act

    e, d, i, k, m = 8, 512, 256, 6, 2
    gen = torch.Generator(DEV).manual_seed(split * 13 + len(shape))
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    flat_ids, flat_w = ids.reshape(-1).contiguous(), w.reshape(-1).float().contiguous()
    bn, warps, unroll, kd, stages = SPLIT_SHAPES[shape]

    def run(s):
        poison()
        zq = torch.full((m * k, i), float("nan"), dtype=torch.float16, device=DEV)
        zs = torch.full((m * k, i // 128), float("nan"), dtype=torch.float32, device=DEV)
        mma_glu_stage(x, flat_ids, flat_w, packed, LIMIT, k, zq, zs, bn=bn, num_warps=warps, unroll=unroll,
                      dot_blocks=kd, num_stages=stages, split=s)
        assert _counters_zero(zq.device), f"split {s}: arrival counters not reset"
        return zq, zs

    zq1, zs1 = run(1)
    zq, zs = run(split)
    zq_again, zs_again = run(split)
    assert torch.equal(_bits(zq), _bits(zq_again)) and torch.equal(_bits(zs), _bits(zs_again)), "not deterministic"
    order = _act_order(i).to(DEV)

    def dequant(q16, s32):
        q = torch.empty(i, dtype=torch.float32, device=DEV)
        q[order] = q16.float()
        return (q * s32.repeat_interleave(128))[None]

    for p, z_ref in enumerate(_glu_ref(x, ids, w, experts)):
        if z_ref is None:
            assert bool(zq[p].isnan().all()) and bool(zs[p].isnan().all()), f"pair {p} of another rank was written"
            continue
        q_ref, s_ref = quantize_act(z_ref[None])
        want = q_ref.float()[0] * s_ref[0].repeat_interleave(128)
        close_bf16(dequant(zq[p], zs[p]), want[None], rel=1e-2, what=f"{shape} split {split} z of pair {p}")
        close_bf16(dequant(zq[p], zs[p]), dequant(zq1[p], zs1[p]), rel=1e-2, what=f"{shape} split {split} vs 1")


@pytest.mark.parametrize("split", [2, 3, 4])
def test_mma_down_stage_split(split, poison, close_bf16):
    """Down split-K: y rows = bf16(dequant(z) . W2_e^T), close to the unsplit launch's, bit-identical when
    repeated; rows of other ranks' pairs stay NaN; counters back at zero."""
    from dsv4.kernels.moe import _expert_weight_f32, finalize_experts
    from dsv4.kernels.moe_gemv import mma_down_stage
    from dsv4.quant.fp8 import quantize_act

    e, d, i, k, m = 8, 256, 512, 6, 2
    gen = torch.Generator(DEV).manual_seed(split + 101)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    ids, _ = _routing(m, e, k, gen, other_ranks=True)
    flat_ids = ids.reshape(-1).contiguous()
    pairs = m * k
    z = torch.randn(pairs, i, generator=gen, device=DEV) * torch.rand(pairs, 1, generator=gen, device=DEV) * 4
    q, s = quantize_act(z.to(torch.bfloat16))
    zq = q.float()[:, _act_order(i).to(DEV)].to(torch.float16).contiguous()

    def run(sp):
        poison()
        y = torch.full((pairs, d), float("nan"), dtype=torch.bfloat16, device=DEV)
        mma_down_stage(zq, s.contiguous(), flat_ids, packed, y, bn=64, unroll=1, split=sp)
        assert _counters_zero(y.device), f"split {sp}: arrival counters not reset"
        return y

    y1, y, y_again = run(1), run(split), run(split)
    assert torch.equal(_bits(y), _bits(y_again)), "not deterministic"
    a = q.float() * s.repeat_interleave(128, dim=1)
    for p in range(pairs):
        ex = int(flat_ids[p])
        if ex < 0:
            assert bool(y[p].isnan().all()), f"pair {p} of another rank was written"
            continue
        w2 = _expert_weight_f32(experts.w2[ex], experts.w2_scale[ex], "mxfp4")
        close_bf16(y[p:p + 1], (a[p:p + 1] @ w2.t()).to(torch.bfloat16), what=f"split {split} y of pair {p}")
        close_bf16(y[p:p + 1], y1[p:p + 1], what=f"split {split} vs 1, pair {p}")


def test_mma_moe_split_end_to_end(poison, close_bf16):
    """fused_moe with MoEConfig(gemv_split=3, gemv_split_down=2) (another rank's pairs included) against
    fused_moe_ref; split-K arguments rejected where they do not apply."""
    from dsv4.kernels.moe import MoEConfig, finalize_experts, fused_moe, fused_moe_ref
    from dsv4.kernels.moe_gemv import moe_gemv

    e, d, i, k, m = 16, 512, 256, 6, 1
    gen = torch.Generator(DEV).manual_seed(2024)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    cfg = MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True,
                    gemv_unroll=1, gemv_split=3, gemv_split_down=2)
    poison()
    y = fused_moe(x, ids, w, packed, out_dtype=torch.float32, config=cfg)
    close_bf16(y, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2, what="split-K fused_moe")
    assert _counters_zero(y.device)
    for bad in (dict(method="mma", bn=64, split=0), dict(method="mma", bn=64, split_down=-1),
                dict(method="cuda", split=0), dict(method="cuda", bn=32, split=3)):  # 3 splits of 4 K blocks
        with pytest.raises(ValueError, match="split"):
            moe_gemv(x, ids, w, packed, LIMIT, **bad)


@pytest.mark.parametrize("split,split_down,unroll", [(2, 1, 2), (4, 2, 2), (8, 4, 4), (1, 2, 1)])
def test_cuda_moe_split_matches_reference(split, split_down, unroll, poison, close_bf16):
    """Method "cuda" with split-K (the last split to arrive finishes the SwiGLU / the row) against
    fused_moe_ref, another rank's pairs included; twice, so the reset arrival counters are exercised."""
    from dsv4.kernels.moe import MoEConfig, finalize_experts, fused_moe, fused_moe_ref

    e, d, i, k, m = 16, 1024, 512, 6, 2
    gen = torch.Generator(DEV).manual_seed(77 + split * 5 + split_down)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=True)
    cfg = MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=32, gemv_unroll=unroll,
                    gemv_split=split, gemv_split_down=split_down)
    ref = fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32)
    for _ in range(2):
        poison()
        y = fused_moe(x, ids, w, packed, out_dtype=torch.float32, config=cfg)
        close_bf16(y, ref, rel=1e-2, what=f"cuda split {split}/{split_down}")


@pytest.mark.parametrize("per_program", [2, 4])
@pytest.mark.parametrize("pairs,e,drop", [(1, 8, False), (7, 4, False), (48, 16, True), (384, 256, False),
                                          (600, 32, True), (2000, 256, False)])
def test_pair_blocks_match_reference(pairs, e, drop, per_program):
    """The blocks of pairs of one expert (sorted by expert, pair order within; unused rows -1) against the
    blocks written out in Python, with other ranks' pairs (-1, E) in no block."""
    from dsv4.kernels.moe_gemv_pairs import pair_blocks, pair_blocks_ref

    gen = torch.Generator(DEV).manual_seed(pairs + e + per_program)
    ids = torch.randint(0, e, (pairs,), generator=gen, device=DEV, dtype=torch.int32)
    if drop:
        other = torch.rand(pairs, generator=gen, device=DEV)
        ids = torch.where(other < 0.2, -1, torch.where(other < 0.3, e, ids))
    blk = torch.full((pairs, per_program), -7, dtype=torch.int32, device=DEV)  # poisoned: every row written
    blk.copy_(pair_blocks(ids, e, per_program))
    assert torch.equal(blk.cpu(), pair_blocks_ref(ids.cpu(), e, per_program))


@pytest.mark.parametrize("per_program", [2, 4])
@pytest.mark.parametrize("other_ranks", [False, True])
@pytest.mark.parametrize("m", [5, 24])
@pytest.mark.parametrize("shape", ["bn64", "bn128_w8", "bn64_u1_s4"])
def test_pairs_per_program_same_bits(shape, m, other_ranks, per_program, poison, close_bf16, monkeypatch):
    """pairs_per_program=2 / 4 (dsv4.kernels.moe_gemv_pairs) writes the same bits as one pair per program for
    every pair of this rank (both reading the scale bytes: by default the words serve only blocks of pairs, and
    they may flip a last bit, test_moe_gemv_words), and fused_moe with it matches the reference."""
    from dsv4.kernels import moe_gemv as mg
    from dsv4.kernels.moe import MoEConfig, finalize_experts, fused_moe, fused_moe_ref
    from dsv4.kernels.moe_gemv import moe_gemv

    e, d, i, k = 16, 512, 256, 6
    gen = torch.Generator(DEV).manual_seed(m * 7 + len(shape) + other_ranks + per_program)
    experts = _experts(e, d, i, gen)
    packed = finalize_experts(experts)
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen, other_ranks=other_ranks)
    launch = _launch(shape)
    mine = (ids.reshape(-1) >= 0).nonzero()[:, 0]
    words = mg.SCALE_WORDS
    monkeypatch.setattr(mg, "SCALE_WORDS", False)
    poison()
    one = moe_gemv(x, ids, w, packed, LIMIT, method="mma", **launch)[mine]
    poison()
    more = moe_gemv(x, ids, w, packed, LIMIT, method="mma", pairs_per_program=per_program, **launch)[mine]
    assert torch.equal(one.view(torch.int16), more.view(torch.int16)), f"{shape} m={m}: bits differ"
    monkeypatch.setattr(mg, "SCALE_WORDS", words)  # fused_moe below on the defaults
    cfg = MoEConfig(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=launch["bn"], gemv_mma=True,
                    warps1=launch["num_warps"], gemv_stages=launch["num_stages"], gemv_unroll=launch["unroll"],
                    gemv_pairs=per_program)
    y = fused_moe(x, ids, w, packed, out_dtype=torch.float32, config=cfg)
    close_bf16(y, fused_moe_ref(x, ids, w, experts, out_dtype=torch.float32), rel=1e-2, what=f"{shape} m={m}")


def _tiny_inputs(seed: int):
    """(packed experts, x, ids, w) of 2 tokens, 4 experts, top-2: for the launch checks that refuse bad values."""
    from dsv4.kernels.moe import finalize_experts

    gen = torch.Generator(DEV).manual_seed(seed)
    packed = finalize_experts(_experts(4, 512, 256, gen))
    x = torch.randn(2, 512, generator=gen, device=DEV).to(torch.bfloat16)
    return (packed, x, *_routing(2, 4, 2, gen))


def test_pairs_per_program_rejects_bad_launches():
    from dsv4.kernels.moe_gemv import moe_gemv

    packed, x, ids, w = _tiny_inputs(3)
    for bad in (dict(split=2), dict(split_down=2), dict(unroll=4, pairs_per_program=4), dict(pairs_per_program=3)):
        with pytest.raises(ValueError, match="pairs_per_program"):
            moe_gemv(x, ids, w, packed, LIMIT, bn=64, method="mma", **{"pairs_per_program": 2, **bad})


def test_fused_moe_takes_one_pair_where_blocks_do_not_fit(poison):
    """A config with blocks of 4 pairs and 4 K blocks per loop step (64 MMA columns, over the limit): fused_moe runs
    one pair per program instead; and blocks of 2 with a one-block inter dimension (the down GEMM at one K block
    per step). The same bits as one pair per program either way."""
    from dsv4.kernels.moe import MoEConfig, finalize_experts, fused_moe

    e, d, i, k, m = 8, 512, 128, 6, 16
    gen = torch.Generator(DEV).manual_seed(11)
    packed = finalize_experts(_experts(e, d, i, gen))
    x = (torch.randn(m, d, generator=gen, device=DEV) * 2).to(torch.bfloat16)
    ids, w = _routing(m, e, k, gen)
    base = dict(bm=16, bn1=128, bn2=128, quant_first=True, quant_out=True, gemv=64, gemv_mma=True)
    for pairs, unroll in ((4, 4), (2, 2)):
        poison()
        one = fused_moe(x, ids, w, packed, config=MoEConfig(**base, gemv_unroll=unroll))
        poison()
        more = fused_moe(x, ids, w, packed, config=MoEConfig(**base, gemv_pairs=pairs, gemv_unroll=unroll))
        assert torch.equal(more.view(torch.int16), one.view(torch.int16)), f"{pairs} pairs, unroll {unroll}"
