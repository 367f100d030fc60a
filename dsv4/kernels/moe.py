"""Routed-expert MoE: grouped GEMMs over experts with fused SwiGLU clamp, routing weight and combine.

Semantics (deepseek_v4_model.md §2.9, checkpoint_format.md §6-§7), per token t and chosen expert e:
    gate = bf16(W1_e · x)   up = bf16(W3_e · x)                  (FP8-activation GEMMs)
    z    = bf16( w_te · silu(min(gate, L)) · clamp(up, -L, L) )   (fp32 math, L = swiglu_limit)
    y_e  = bf16(W2_e · z)
    out  = bf16( Σ_e y_e [+ shared] )                            (fp32 sum)
Each GEMM quantises its bf16 input per row and 128 channels (pow2 scales) to e4m3. MXFP4 weights
are e2m1 codes with one E8M0 scale per 32 inputs; each 32-wide K group is an exact FP8 MMA
(e2m1 codes are e4m3 values times 2^-6) scaled by its group scale, so the accumulation order is the
reference's. `act="bf16"` is the W4A16 option: the weights are widened to bf16 and the activations
are not quantised (not reference-exact; kept as a measured alternative).

Layouts (`ExpertWeights` -> `finalize_experts` -> `PackedExperts`) live in dsv4.kernels.moe_layout, launch
shapes (`MoEConfig`, `pick_moe_config`) in dsv4.kernels.moe_config; both are re-exported here. Decode-sized
MXFP4 batches take the per-pair kernels of dsv4.kernels.moe_gemv (`MoEConfig.gemv`; tensor-core
variant with `gemv_mma`, the default since session 7, or the CUDA-core one); larger ones dsv4.kernels.moe_wide
(`MoEConfig.wide`; 16-token tiles from just past the per-pair kernels' range since session 66).

Pipeline of `fused_moe`: `moe_align` -> [act_quant] -> GEMM1 (w13, SwiGLU epilogue, optional fused
FP8 quantisation of z) -> GEMM2 (w2, one bf16 row per (token, slot)) -> combine (fp32 sum over slots).

Expert parallel: ids outside [0, num_experts) (-1) are pairs held by another rank; they are skipped,
and `out_dtype=torch.float32` returns the unrounded fp32 sum so that the ranks' partial sums can be
added before the one final rounding (dsv4.distributed.moe_comm).
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn.functional as F

from dsv4.kernels.fp8_linear import HAS_TRITON, act_quant
from dsv4.kernels.moe_align import moe_align
from dsv4.kernels.moe_combine import check_shared, combine
from dsv4.kernels.moe_config import MoEConfig, per_group_config, pick_moe_config  # noqa: F401  (re-exported)
from dsv4.kernels.moe_layout import (  # noqa: F401  (ExpertWeights, finalize_experts: re-exported)
    BLOCK, ExpertWeights, PackedExperts, check_packed, finalize_experts,
)

if HAS_TRITON:
    import triton
    import triton.language as tl

    from dsv4.kernels.fp8_linear import _pow2_scale, _quant_rows

# --------------------------------------------------------------------------- torch reference


def _expert_weight_f32(w: torch.Tensor, s: torch.Tensor, fmt: str) -> torch.Tensor:
    if fmt == "mxfp4":
        from dsv4.quant.mxfp4 import dequantize_mxfp4

        return dequantize_mxfp4(w, s, torch.float32)
    from dsv4.quant.fp8 import dequantize_fp8_block

    return dequantize_fp8_block(w, s, torch.float32)


def _linear_ref(x: torch.Tensor, w: torch.Tensor, act: str) -> torch.Tensor:
    if act == "fp8":
        from dsv4.quant.fp8 import quantize_act

        q, s = quantize_act(x)
        a = q.to(torch.float32) * s.repeat_interleave(BLOCK, dim=-1)
    else:
        a = x.to(torch.float32)
    return (a @ w.t()).to(torch.bfloat16)


def fused_moe_ref(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: ExpertWeights,
    swiglu_limit: float = 10.0,
    act: str = "fp8",
    shared: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Reference routed MoE on checkpoint-layout experts; loops over the experts that have tokens
    (ids outside [0, E) are skipped)."""
    _check_act(act, experts.fmt)
    ids = topk_ids.long()
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        if not 0 <= e < experts.num_experts:
            continue
        tok, slot = torch.where(ids == e)
        w1 = _expert_weight_f32(experts.w1[e], experts.w1_scale[e], experts.fmt)
        w3 = _expert_weight_f32(experts.w3[e], experts.w3_scale[e], experts.fmt)
        w2 = _expert_weight_f32(experts.w2[e], experts.w2_scale[e], experts.fmt)
        xe = x[tok]
        gate = _linear_ref(xe, w1, act).float().clamp(max=swiglu_limit)
        up = _linear_ref(xe, w3, act).float().clamp(-swiglu_limit, swiglu_limit)
        z = F.silu(gate) * up * topk_weights[tok, slot].float()[:, None]
        y.index_add_(0, tok, _linear_ref(z.to(torch.bfloat16), w2, act).float())
    if shared is not None:
        y += shared.float()
    return y.to(out_dtype)


def _check_act(act: str, fmt: str) -> None:
    if act not in ("fp8", "bf16"):
        raise ValueError(f"moe: act must be 'fp8' or 'bf16', got {act!r}")
    if fmt not in ("mxfp4", "fp8"):
        raise ValueError(f"moe: expert format must be 'mxfp4' or 'fp8', got {fmt!r}")
    if fmt == "fp8" and act != "fp8":
        raise ValueError("moe: FP8 experts support only act='fp8'")


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:

    @triton.jit
    def _fp4_lo(b, USE_ASM: tl.constexpr):
        """Low nibbles (e2m1 codes) of uint8 bytes -> e4m3 holding e2m1 * 2^-6 (exact bit move)."""
        if USE_ASM:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 t0, t1; and.b32 t0, $1, 0x07070707; shl.b32 t0, t0, 2; "
                "and.b32 t1, $1, 0x08080808; shl.b32 t1, t1, 4; or.b32 $0, t0, t1; }",
                "=r,r", [b], dtype=tl.float8e4nv, is_pure=True, pack=4)
        else:
            v = b.to(tl.int32)
            v = ((v & 7) << 2) | ((v & 8) << 4)
            return v.to(tl.uint8).to(tl.float8e4nv, bitcast=True)

    @triton.jit
    def _fp4_hi(b, USE_ASM: tl.constexpr):
        """High nibbles of uint8 bytes -> e4m3 holding e2m1 * 2^-6."""
        if USE_ASM:
            return tl.inline_asm_elementwise(
                "{ .reg .b32 t0, t1; shr.u32 t0, $1, 2; and.b32 t0, t0, 0x1C1C1C1C; "
                "and.b32 t1, $1, 0x80808080; or.b32 $0, t0, t1; }",
                "=r,r", [b], dtype=tl.float8e4nv, is_pure=True, pack=4)
        else:
            v = b.to(tl.int32)
            v = ((v >> 2) & 0x1C) | (v & 0x80)
            return v.to(tl.uint8).to(tl.float8e4nv, bitcast=True)

    @triton.jit
    def _group_scale(sc, g: tl.constexpr):
        """fp32 2^(b - 127 + 6) from byte g of the packed scales: undoes the 2^-6 of `_fp4_lo/_hi`."""
        b = (sc >> (8 * g)) & 0xFF
        return ((b + 6) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _group_dot(acc, a, w, f, sa, SWAP: tl.constexpr):
        """acc += (A · W^T) · f · sa for one MMA over a 32-wide K group. Default (mma.sync, operands
        widened to f16): exact products summed in fp32. SWAP (an option, not the default): the weight
        rows are the MMA's M side (acc is [BN, BM]) so that a 16-token tile is an FP8 wgmma's N side --
        20 % faster at decode sizes, but the FP8 wgmma sums its 32 products in a shortened accumulator
        (it moved a near-tie of the embedded model's greedy text); with f16 operands it is exact but
        slower than the default (docs/kernels_notes.md, session 4)."""
        if SWAP:
            acc = acc + tl.dot(w, tl.trans(a)) * f[:, None] * sa[None, :]
        else:
            acc = acc + tl.dot(a, tl.trans(w)) * f[None, :] * sa[:, None]
        return acc

    @triton.jit
    def _group_dot16(acc, a, w, f, SWAP: tl.constexpr):
        """W4A16: widen the group to bf16 with its scale folded in (exact), plain MMA accumulation."""
        wb = (w.to(tl.float32) * f[:, None]).to(tl.bfloat16)
        if SWAP:
            acc = tl.dot(wb, tl.trans(a), acc)
        else:
            acc = tl.dot(a, tl.trans(wb), acc)
        return acc

    @triton.jit
    def _fp4_mma(acc, a0, a1, a2, a3, sa, Wp, sc, kb, A16: tl.constexpr, USE_ASM: tl.constexpr,
                 SWAP: tl.constexpr):
        """acc += one 128-wide K block of A · W^T for MXFP4 rows (4 groups of 32, scales packed in sc)."""
        b01 = tl.load(Wp + kb * 64)
        b23 = tl.load(Wp + kb * 64 + 32)
        if A16:
            acc = _group_dot16(acc, a0, _fp4_lo(b01, USE_ASM), _group_scale(sc, 0), SWAP)
            acc = _group_dot16(acc, a1, _fp4_hi(b01, USE_ASM), _group_scale(sc, 1), SWAP)
            acc = _group_dot16(acc, a2, _fp4_lo(b23, USE_ASM), _group_scale(sc, 2), SWAP)
            acc = _group_dot16(acc, a3, _fp4_hi(b23, USE_ASM), _group_scale(sc, 3), SWAP)
        else:  # W4A8: the reference's order, one FP8 MMA per group times its group and act scales
            acc = _group_dot(acc, a0, _fp4_lo(b01, USE_ASM), _group_scale(sc, 0), sa, SWAP)
            acc = _group_dot(acc, a1, _fp4_hi(b01, USE_ASM), _group_scale(sc, 1), sa, SWAP)
            acc = _group_dot(acc, a2, _fp4_lo(b23, USE_ASM), _group_scale(sc, 2), sa, SWAP)
            acc = _group_dot(acc, a3, _fp4_hi(b23, USE_ASM), _group_scale(sc, 3), sa, SWAP)
        return acc

    @triton.jit
    def _fp8w_mma(acc, a, sa, Wp, sw, kb, SWAP: tl.constexpr):
        """acc += one 128-wide K block of A · W^T for FP8 rows with 128x128 fp32 scales (sw per tile)."""
        w = tl.load(Wp + kb * 128)
        if SWAP:  # see _group_dot
            acc = acc + tl.dot(w, tl.trans(a)) * sa[None, :] * sw
        else:
            acc = acc + tl.dot(a, tl.trans(w)) * sa[:, None] * sw
        return acc

    @triton.jit
    def _block_pairs(pid_m, EXPERT_IDS, SORTED, num_pairs, top_k, BM: tl.constexpr, GATHER_A: tl.constexpr):
        """Row block pid_m of `moe_align`'s layout: (expert, sorted slots, pair ids, valid mask, activation
        rows: the pairs' tokens with GATHER_A, else the sorted slots themselves)."""
        e = tl.load(EXPERT_IDS + pid_m).to(tl.int64)
        offs_p = pid_m * BM + tl.arange(0, BM)
        pair = tl.load(SORTED + offs_p)
        valid = pair < num_pairs
        if GATHER_A:
            rows = tl.where(valid, pair // top_k, 0)
        else:
            rows = offs_p
        return e, offs_p, pair, valid, rows

    @triton.jit(do_not_specialize=["num_pairs", "top_k"])
    def _moe_gemm_kernel(
        A, SA, W, WS, C, CS,
        SORTED, EXPERT_IDS, NUM_POST, TOPK_W,
        N, K, num_pairs, top_k, up_off, limit,
        stride_am, stride_sam,
        stride_we, stride_wn, stride_wse, stride_wsk,
        stride_cm, stride_csm,
        BM: tl.constexpr, BN: tl.constexpr,
        A_MODE: tl.constexpr,  # 0: fp8 + scales given, 1: bf16 quantised here, 2: bf16 (W4A16)
        W_FP8: tl.constexpr, GLU: tl.constexpr, QUANT_OUT: tl.constexpr, GATHER_A: tl.constexpr,
        USE_ASM: tl.constexpr, KBP: tl.constexpr,  # KBP: next power of two >= K // 128
        SWAP: tl.constexpr,  # accumulate [BN, BM] (weights as the MMA's M side; small token tiles)
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if pid_m * BM >= tl.load(NUM_POST):
            return
        e, offs_p, pair, valid, rows = _block_pairs(pid_m, EXPERT_IDS, SORTED, num_pairs, top_k, BM, GATHER_A)
        offs_n = pid_n * BN + tl.arange(0, BN)
        W_e = W + e * stride_we
        WS_e = WS + e * stride_wse
        if SWAP:
            acc = tl.zeros((BN, BM), dtype=tl.float32)
            acc_u = tl.zeros((BN, BM), dtype=tl.float32)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        A16: tl.constexpr = A_MODE == 2

        # Scale loads feed no MMA operand, so Triton's pipeliner would leave them in the loop, each
        # waiting a memory latency: load all K blocks' scales of this tile once, select one per step.
        KB = K // 128
        kidx = tl.arange(0, KBP)
        kmask = kidx < KB
        PRELOAD_SA: tl.constexpr = (A_MODE == 0) and (BM * KBP <= 2048)
        PRELOAD_WS: tl.constexpr = KBP <= 32  # a [BN, 64] tile per weight set measured 2x slower (Pro)
        if PRELOAD_SA:
            sa_all = tl.load(SA + rows[:, None] * stride_sam + kidx[None, :], mask=valid[:, None] & kmask[None, :],
                             other=0.0)
        if W_FP8:
            offs_k = tl.arange(0, 128)
            a_ptrs = A + rows[:, None] * stride_am + offs_k[None, :]
            Wg = W_e + offs_n[:, None] * stride_wn + offs_k[None, :]
            Wu = Wg + up_off * stride_wn
            # BN <= 128: one 128-row scale block per tile
            sg_all = tl.load(WS_e + (pid_n * BN // 128) * stride_wsk + kidx, mask=kmask, other=0.0)
            su_all = tl.load(WS_e + ((pid_n * BN + up_off) // 128) * stride_wsk + kidx, mask=kmask, other=0.0)
            for kb in range(0, KB):
                a = tl.load(a_ptrs + kb * 128, mask=valid[:, None], other=0.0)
                if A_MODE == 1:
                    a, sa = _quant_rows(a.to(tl.float32))
                elif PRELOAD_SA:
                    sa = tl.sum(tl.where(kidx[None, :] == kb, sa_all, 0.0), axis=1)
                else:
                    sa = tl.load(SA + rows * stride_sam + kb, mask=valid, other=0.0)
                sg = tl.sum(tl.where(kidx == kb, sg_all, 0.0), axis=0)
                acc = _fp8w_mma(acc, a, sa, Wg, sg, kb, SWAP)
                if GLU:
                    su = tl.sum(tl.where(kidx == kb, su_all, 0.0), axis=0)
                    acc_u = _fp8w_mma(acc_u, a, sa, Wu, su, kb, SWAP)
        else:
            offs_k = tl.arange(0, 32)
            a_ptrs = A + rows[:, None] * stride_am + offs_k[None, :]
            Wg = W_e + offs_n[:, None] * stride_wn + offs_k[None, :]
            Wu = Wg + up_off * stride_wn
            # packed group scales, [BN, KBP] int32 per weight set
            WSg = WS_e + offs_n * stride_wsk
            WSu = WSg + up_off * stride_wsk
            if PRELOAD_WS:
                sg_all = tl.load(WSg[:, None] + kidx[None, :], mask=kmask[None, :], other=0)
                if GLU:
                    su_all = tl.load(WSu[:, None] + kidx[None, :], mask=kmask[None, :], other=0)
            for kb in range(0, KB):
                if PRELOAD_WS:
                    sg = tl.sum(tl.where(kidx[None, :] == kb, sg_all, 0), axis=1)
                else:
                    sg = tl.load(WSg + kb)
                a0 = tl.load(a_ptrs + kb * 128, mask=valid[:, None], other=0.0)
                a1 = tl.load(a_ptrs + kb * 128 + 32, mask=valid[:, None], other=0.0)
                a2 = tl.load(a_ptrs + kb * 128 + 64, mask=valid[:, None], other=0.0)
                a3 = tl.load(a_ptrs + kb * 128 + 96, mask=valid[:, None], other=0.0)
                if A_MODE == 0:
                    if PRELOAD_SA:
                        sa = tl.sum(tl.where(kidx[None, :] == kb, sa_all, 0.0), axis=1)
                    else:
                        sa = tl.load(SA + rows * stride_sam + kb, mask=valid, other=0.0)
                elif A_MODE == 1:
                    x0 = a0.to(tl.float32)
                    x1 = a1.to(tl.float32)
                    x2 = a2.to(tl.float32)
                    x3 = a3.to(tl.float32)
                    amax = tl.maximum(tl.maximum(tl.max(tl.abs(x0), axis=1), tl.max(tl.abs(x1), axis=1)),
                                      tl.maximum(tl.max(tl.abs(x2), axis=1), tl.max(tl.abs(x3), axis=1)))
                    sa, inv = _pow2_scale(tl.maximum(amax, 1e-4))
                    a0 = tl.clamp(x0 * inv[:, None], -448.0, 448.0).to(tl.float8e4nv)
                    a1 = tl.clamp(x1 * inv[:, None], -448.0, 448.0).to(tl.float8e4nv)
                    a2 = tl.clamp(x2 * inv[:, None], -448.0, 448.0).to(tl.float8e4nv)
                    a3 = tl.clamp(x3 * inv[:, None], -448.0, 448.0).to(tl.float8e4nv)
                else:
                    sa = tl.zeros((BM,), dtype=tl.float32)  # unused in W4A16
                acc = _fp4_mma(acc, a0, a1, a2, a3, sa, Wg, sg, kb, A16, USE_ASM, SWAP)
                if GLU:
                    if PRELOAD_WS:
                        su = tl.sum(tl.where(kidx[None, :] == kb, su_all, 0), axis=1)
                    else:
                        su = tl.load(WSu + kb)
                    acc_u = _fp4_mma(acc_u, a0, a1, a2, a3, sa, Wu, su, kb, A16, USE_ASM, SWAP)

        if SWAP:
            acc = tl.trans(acc)
            acc_u = tl.trans(acc_u)
        if GLU:
            gate = tl.minimum(acc.to(tl.bfloat16).to(tl.float32), limit)
            up = tl.clamp(acc_u.to(tl.bfloat16).to(tl.float32), -limit, limit)
            rw = tl.load(TOPK_W + pair, mask=valid, other=0.0)
            z = (gate / (1.0 + tl.exp(-gate)) * up) * rw[:, None]
            zb = z.to(tl.bfloat16)
            c_ptrs = C + offs_p[:, None] * stride_cm + offs_n[None, :]
            if QUANT_OUT:  # BN == 128: this tile is exactly one quantisation block of W2's input
                q, s = _quant_rows(zb.to(tl.float32))
                tl.store(c_ptrs, q)
                tl.store(CS + offs_p * stride_csm + pid_n, s)
            else:
                tl.store(c_ptrs, zb)
        else:
            c_ptrs = C + pair[:, None].to(tl.int64) * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, acc.to(tl.bfloat16), mask=valid[:, None])


# --------------------------------------------------------------------------- Triton entry point


def fused_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: PackedExperts,
    swiglu_limit: float = 10.0,
    act: str = "fp8",
    shared=None,  # tensor, or a zero-argument join giving it (called right before the combine)
    config: MoEConfig | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    x_quant: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Triton routed MoE (contract of `fused_moe_ref`, with `finalize_experts` weights): [M, D] in
    out_dtype (bf16, or fp32 for an unrounded expert-parallel partial sum). `x_quant`: x already quantised for
    the per-pair GLU (`router.gate_route(x_quant=)`), used where that path runs."""
    _check_act(act, experts.fmt)
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"fused_moe: out_dtype must be bfloat16 or float32, got {out_dtype}")
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != experts.hidden:
        raise ValueError(f"fused_moe: expected bf16 x [M, {experts.hidden}], got {x.dtype} {tuple(x.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_moe: topk_ids {tuple(topk_ids.shape)} / topk_weights "
                         f"{tuple(topk_weights.shape)} do not match x {tuple(x.shape)}")
    if shared is not None and not callable(shared):
        check_shared(shared, x.shape)
    check_packed(experts)
    m, d = x.shape
    top_k = topk_ids.shape[1]
    e, i = experts.num_experts, experts.inter
    out = torch.empty((m, d), dtype=out_dtype, device=x.device)
    if m == 0:
        if callable(shared):
            shared()  # the join
        return out
    num_pairs = m * top_k
    cfg = config or pick_moe_config(num_pairs, e, act, hidden=d)
    wide = cfg.wide and experts.fmt == "mxfp4" and experts.wide_ok and act == "fp8"
    if cfg.wide and not wide:  # the wide kernel does not apply: the per-group kernel's measured shape
        cfg = per_group_config(num_pairs, e, act)
    quant_out = act == "fp8" and cfg.quant_out
    if quant_out and cfg.bn1 != BLOCK:
        raise ValueError("fused_moe: quant_out needs bn1 == 128")
    if i % cfg.bn1 or d % cfg.bn2 or max(cfg.bn1, cfg.bn2) > BLOCK:
        raise ValueError(f"fused_moe: block sizes {cfg.bn1}/{cfg.bn2} must be <= 128 and divide inter {i} / hidden {d}")
    x = x.contiguous()
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
    if cfg.gemv and experts.fmt == "mxfp4" and act == "fp8":
        from dsv4.kernels.moe_gemv import moe_gemv, pairs_fit
        # blocks of pairs need at most 32 MMA columns, no split and a pairing in one program (else one pair each)
        pairs = cfg.gemv_pairs if pairs_fit(cfg, d, i, num_pairs) else 1
        # the combine included (`moe_combine.combine`: its own launch, after the join)
        return moe_gemv(x, ids, topk_weights, experts, swiglu_limit, bn=cfg.gemv, num_warps=cfg.warps1,
                        unroll=cfg.gemv_unroll, method="mma" if cfg.gemv_mma else "cuda", num_stages=cfg.gemv_stages,
                        dot_blocks=cfg.gemv_dot_blocks, split=cfg.gemv_split, split_down=cfg.gemv_split_down,
                        down_stages=cfg.gemv_down_stages, down_dot_blocks=cfg.gemv_down_dot_blocks,
                        out=out, shared=shared, pairs_per_program=pairs,
                        x_quant=x_quant if cfg.gemv_mma else None)
    mixed = False
    if wide:
        from dsv4.kernels import moe_wide as mw
        if cfg.mixed and cfg.bm == 128 and mw.gluon_path(x.device):  # 128 + 64-row tiles on 64-row blocks
            cfg, mixed = dataclasses.replace(cfg, bm=64), True
    sorted_ids, expert_ids, num_post = moe_align(topk_ids, e, cfg.bm)
    if wide:
        from dsv4.kernels.moe_wide import moe_wide
        y = moe_wide(x, sorted_ids, expert_ids, num_post, topk_weights, top_k, experts, swiglu_limit, bm=cfg.bm,
                     bn2=cfg.bn2, num_warps=cfg.warps1, num_stages=cfg.num_stages, maxnreg=cfg.maxnreg, mixed=mixed)
        return combine(y, shared, ids, out, e)
    nb = expert_ids.numel()
    rows = nb * cfg.bm
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    w_fp8 = experts.fmt == "fp8"
    use_asm = cfg.use_asm and os.environ.get("TRITON_INTERPRET") != "1"  # the interpreter runs no inline PTX
    meta = dict(BM=cfg.bm, W_FP8=w_fp8, USE_ASM=use_asm, SWAP=cfg.swap, num_stages=cfg.num_stages)

    # GEMM1: [pairs, D] x w13^T -> z [rows, I] in sorted order
    if act == "bf16":
        a1, sa1, mode1, s_sa1 = x, x, 2, 0
    elif cfg.quant_first:
        a1, sa1 = act_quant(x)
        mode1, s_sa1 = 0, sa1.stride(0)
    else:
        a1, sa1, mode1, s_sa1 = x, x, 1, 0
    if quant_out:
        z = torch.empty((rows, i), dtype=torch.float8_e4m3fn, device=x.device)
        zs = torch.empty((rows, i // BLOCK), dtype=torch.float32, device=x.device)
    else:
        z = torch.empty((rows, i), dtype=torch.bfloat16, device=x.device)
        zs = z
    w13, s13 = experts.w13, experts.w13_scale
    _moe_gemm_kernel[(nb, i // cfg.bn1)](
        a1, sa1, w13, s13, z, zs, sorted_ids, expert_ids, num_post, tw,
        i, d, num_pairs, top_k, i, float(swiglu_limit),
        a1.stride(0), s_sa1, w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1),
        z.stride(0), zs.stride(0) if quant_out else 0,
        BN=cfg.bn1, A_MODE=mode1, GLU=True, QUANT_OUT=quant_out, GATHER_A=True, num_warps=cfg.warps1,
        KBP=triton.next_power_of_2(d // BLOCK), **meta,
    )

    # GEMM2: z [rows, I] x w2^T -> y [pairs, D], one bf16 row per (token, slot)
    mode2 = 2 if act == "bf16" else (0 if quant_out else 1)
    y = torch.empty((num_pairs, d), dtype=torch.bfloat16, device=x.device)
    w2, s2 = experts.w2, experts.w2_scale
    _moe_gemm_kernel[(nb, d // cfg.bn2)](
        z, zs, w2, s2, y, y, sorted_ids, expert_ids, num_post, tw,
        d, i, num_pairs, top_k, 0, float(swiglu_limit),
        z.stride(0), zs.stride(0) if quant_out else 0, w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1),
        y.stride(0), 0,
        BN=cfg.bn2, A_MODE=mode2, GLU=False, QUANT_OUT=False, GATHER_A=False, num_warps=cfg.warps2,
        KBP=triton.next_power_of_2(i // BLOCK), **meta,
    )

    return combine(y, shared, ids, out, e)
