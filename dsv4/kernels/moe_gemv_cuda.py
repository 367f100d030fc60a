"""Routed MXFP4 MoE for decode-sized batches on CUDA cores: `moe_gemv(..., method="cuda")`
(dsv4.kernels.moe_gemv has the contract and the tensor-core method "mma", the default path). One program per
(token, slot) pair and tile of BN output rows; each 32-wide weight group's products are summed by a reduction
tree on CUDA cores, scaled by the group scale and the activation block scale (the W4A8 math of
`moe._fp4_mma`), z rounded to bf16 and re-quantised to e4m3 for W2; split-K along a third program axis (the
last split to arrive finishes the SwiGLU / the row). Kept as the measured alternative (`bench/sweep_moe_gemv.py`;
the "mma" method beat it from session 7, and with split-K still 42.2 vs 47.3 µs at B = 1, session 17); the
picker takes it up to `moe_config.GEMV_CUDA_MAX_PAIRS` pairs (0: never)."""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, arrival_counters, pdl_kernel, pdl_wait, split_k_sum
from dsv4.kernels.fp8_linear import act_quant
from dsv4.kernels.moe_gemv import _unroll, _use_asm
from dsv4.kernels.moe_layout import BLOCK, PackedExperts

if HAS_TRITON:
    import triton
    import triton.language as tl

    from dsv4.kernels.fp8_linear import _quant_rows
    from dsv4.kernels.moe import _fp4_hi, _fp4_lo, _group_scale

    @triton.jit
    def _group_sum(a, w):
        """[BN] fp32 sums of a group's 32 products: a [32] fp32, w [BN, 32] e4m3."""
        return tl.sum(w.to(tl.float32) * a[None, :], axis=1)

    @triton.jit
    def _blocks_dot(acc, Arow, SArow, Wrows, Srows, kb0, UNROLL: tl.constexpr, USE_ASM: tl.constexpr):
        """acc [BN] += UNROLL 128-wide K blocks from kb0 of (A row) . (W rows): per block 4 groups, each
        scaled by its group scale and the block's activation scale (the order of `moe._fp4_mma`).
        All loads of the UNROLL blocks are issued before the first use: Triton does not software-
        pipeline these loads (they feed no dot), so this keeps UNROLL blocks in flight per program."""
        offs = tl.arange(0, 32)
        for u in tl.static_range(UNROLL):
            kb = kb0 + u
            b01 = tl.load(Wrows + kb * 64)
            b23 = tl.load(Wrows + kb * 64 + 32)
            sc = tl.load(Srows + kb)
            sa = tl.load(SArow + kb)
            a0 = tl.load(Arow + kb * 128 + offs).to(tl.float32)
            a1 = tl.load(Arow + kb * 128 + 32 + offs).to(tl.float32)
            a2 = tl.load(Arow + kb * 128 + 64 + offs).to(tl.float32)
            a3 = tl.load(Arow + kb * 128 + 96 + offs).to(tl.float32)
            acc += _group_sum(a0, _fp4_lo(b01, USE_ASM)) * _group_scale(sc, 0) * sa
            acc += _group_sum(a1, _fp4_hi(b01, USE_ASM)) * _group_scale(sc, 1) * sa
            acc += _group_sum(a2, _fp4_lo(b23, USE_ASM)) * _group_scale(sc, 2) * sa
            acc += _group_sum(a3, _fp4_hi(b23, USE_ASM)) * _group_scale(sc, 3) * sa
        return acc

    @pdl_kernel
    @triton.jit(do_not_specialize=["top_k", "num_experts"])
    def _gemv_glu_kernel(Q, SQ, IDS, TOPK_W, W, WS, Z, P, CNT, I, K, top_k, num_experts, limit,
                         stride_q, stride_sq, stride_we, stride_wn, stride_wse, stride_wsn, stride_z, stride_ps,
                         KB_PER_SPLIT, BN: tl.constexpr, UNROLL: tl.constexpr, USE_ASM: tl.constexpr,
                         SPLIT_OUT: tl.constexpr):
        """z[p, n] = bf16(rw * silu(min(gate, L)) * clamp(up, -L, L)) for BN rows n of pair p (program axis 2:
        K ranges of KB_PER_SPLIT blocks; the last to arrive finishes the rows)."""
        pdl_wait()
        p = tl.program_id(0).to(tl.int64)
        e = tl.load(IDS + p).to(tl.int64)
        if (e >= 0) & (e < num_experts):  # else: another rank's expert (its z row is never read)
            t = p // top_k
            pid_k = tl.program_id(2)
            offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
            Wg = W + e * stride_we + offs_n[:, None] * stride_wn + tl.arange(0, 32)[None, :]
            Wu = Wg + I * stride_wn
            Sg = WS + e * stride_wse + offs_n * stride_wsn
            Su = Sg + I * stride_wsn
            gate = tl.zeros((BN,), dtype=tl.float32)
            up = tl.zeros((BN,), dtype=tl.float32)
            kb0 = pid_k * KB_PER_SPLIT
            for kb in range(kb0, kb0 + KB_PER_SPLIT, UNROLL):
                gate = _blocks_dot(gate, Q + t * stride_q, SQ + t * stride_sq, Wg, Sg, kb, UNROLL, USE_ASM)
                up = _blocks_dot(up, Q + t * stride_q, SQ + t * stride_sq, Wu, Su, kb, UNROLL, USE_ASM)
            finish = True
            if SPLIT_OUT:  # partials [split, pairs, 2 I]: gate then up
                tile = p * tl.num_programs(1) + tl.program_id(1)
                both = tl.join(gate, up)  # [BN, 2]
                offs = p * 2 * I + tl.join(offs_n, offs_n + I)
                finish, both = split_k_sum(P, CNT, tile, pid_k, tl.num_programs(2), both, offs, stride_ps)
                gate, up = tl.split(both)
            if finish:
                g = tl.minimum(gate.to(tl.bfloat16).to(tl.float32), limit)
                u = tl.clamp(up.to(tl.bfloat16).to(tl.float32), -limit, limit)
                z = (g / (1.0 + tl.exp(-g)) * u) * tl.load(TOPK_W + p)
                tl.store(Z + p * stride_z + offs_n, z.to(tl.bfloat16))

    @pdl_kernel
    @triton.jit(do_not_specialize=["top_k", "num_experts"])
    def _quant_z_kernel(Z, ZQ, ZS, IDS, num_experts, stride_z, stride_zq, stride_zs):
        """FP8 quantisation of one 128-block of a pair's z row (skipped for other ranks' pairs)."""
        pdl_wait()
        p = tl.program_id(0).to(tl.int64)
        kb = tl.program_id(1)
        e = tl.load(IDS + p)
        if (e >= 0) & (e < num_experts):
            offs = kb * 128 + tl.arange(0, 128)
            q, s = _quant_rows(tl.load(Z + p * stride_z + offs)[None, :].to(tl.float32))
            tl.store(ZQ + p * stride_zq + offs[None, :], q)
            tl.store(ZS + p * stride_zs + kb + tl.arange(0, 1), s)

    @pdl_kernel
    @triton.jit(do_not_specialize=["num_experts"])
    def _gemv_down_kernel(ZQ, ZS, IDS, W, WS, Y, P, CNT, K, num_experts,
                          stride_zq, stride_zs, stride_we, stride_wn, stride_wse, stride_wsn, stride_y, stride_ps,
                          KB_PER_SPLIT, BN: tl.constexpr, UNROLL: tl.constexpr, USE_ASM: tl.constexpr,
                          SPLIT_OUT: tl.constexpr):
        """y[p, n] = bf16(W2_e[n] . z_p) for BN rows n of pair p (program axis 2: K ranges, as the GLU's)."""
        pdl_wait()
        p = tl.program_id(0).to(tl.int64)
        e = tl.load(IDS + p).to(tl.int64)
        if (e >= 0) & (e < num_experts):
            pid_k = tl.program_id(2)
            offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
            Wr = W + e * stride_we + offs_n[:, None] * stride_wn + tl.arange(0, 32)[None, :]
            Sr = WS + e * stride_wse + offs_n * stride_wsn
            acc = tl.zeros((BN,), dtype=tl.float32)
            kb0 = pid_k * KB_PER_SPLIT
            for kb in range(kb0, kb0 + KB_PER_SPLIT, UNROLL):
                acc = _blocks_dot(acc, ZQ + p * stride_zq, ZS + p * stride_zs, Wr, Sr, kb, UNROLL, USE_ASM)
            finish = True
            if SPLIT_OUT:  # partials [split, pairs, D]
                tile = p * tl.num_programs(1) + tl.program_id(1)
                finish, acc = split_k_sum(P, CNT, tile, pid_k, tl.num_programs(2), acc, p * stride_y + offs_n,
                                          stride_ps)
            if finish:
                tl.store(Y + p * stride_y + offs_n, acc.to(tl.bfloat16))


def _split_args(pairs: int, tiles: int, k: int, unroll: int, split: int, width: int, device, user: str):
    """(K blocks per loop step, per split, partials [split, pairs * width] fp32, arrival counters) of a launch
    over K = k (the last two None without a split)."""
    kblocks = k // BLOCK
    if kblocks % split:
        raise ValueError(f"moe_gemv(method='cuda'): split {split} must divide the {kblocks} K blocks")
    u = _unroll(k // split, unroll)
    if split == 1:
        return u, kblocks, None, None
    part = torch.empty((split, pairs * width), dtype=torch.float32, device=device)
    return u, kblocks // split, part, arrival_counters(user, device, pairs * tiles)


def gemv_cuda(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, experts: PackedExperts, swiglu_limit: float,
              top_k: int, bn: int, num_warps: int, unroll: int, split: int = 1,
              split_down: int = 1) -> torch.Tensor:
    """`moe_gemv`'s method "cuda" on checked inputs: y [pairs, D] bf16 (flat ids / routing weights); `split` /
    `split_down`: programs per GLU / down row tile along K (the last to arrive finishes the tile)."""
    pairs, d = ids.numel(), x.shape[1]
    e, i = experts.num_experts, experts.inter
    use_asm = _use_asm()
    q, sq = act_quant(x)
    z = torch.empty((pairs, i), dtype=torch.bfloat16, device=x.device)
    w13, s13 = experts.w13, experts.w13_scale
    s1 = split
    u1, kb1, part1, cnt1 = _split_args(pairs, i // bn, d, unroll, split, 2 * i, x.device, "moe_gemv_cuda glu")
    _gemv_glu_kernel[(pairs, i // bn, s1)](
        q, sq, ids, tw, w13, s13, z, part1 if s1 > 1 else z, cnt1 if s1 > 1 else z, i, d, top_k, e,
        float(swiglu_limit), q.stride(0), sq.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1),
        z.stride(0), part1.stride(0) if s1 > 1 else 0, kb1,
        BN=bn, UNROLL=u1, USE_ASM=use_asm, SPLIT_OUT=s1 > 1, num_warps=num_warps, num_stages=1)
    zq = torch.empty((pairs, i), dtype=torch.float8_e4m3fn, device=x.device)
    zs = torch.empty((pairs, i // BLOCK), dtype=torch.float32, device=x.device)
    _quant_z_kernel[(pairs, i // BLOCK)](z, zq, zs, ids, e, z.stride(0), zq.stride(0), zs.stride(0), num_warps=1)
    y = torch.empty((pairs, d), dtype=torch.bfloat16, device=x.device)
    w2, s2 = experts.w2, experts.w2_scale
    s2_ = split_down
    u2, kb2, part2, cnt2 = _split_args(pairs, d // bn, i, unroll, split_down, d, x.device, "moe_gemv_cuda down")
    _gemv_down_kernel[(pairs, d // bn, s2_)](
        zq, zs, ids, w2, s2, y, part2 if s2_ > 1 else y, cnt2 if s2_ > 1 else y, i, e,
        zq.stride(0), zs.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), y.stride(0),
        part2.stride(0) if s2_ > 1 else 0, kb2,
        BN=bn, UNROLL=u2, USE_ASM=use_asm, SPLIT_OUT=s2_ > 1, num_warps=num_warps, num_stages=1)
    return y
