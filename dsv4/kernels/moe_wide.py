"""Routed MXFP4 MoE for large batches (prefill) on bf16 tensor cores, with the reference's W4A8 values.

Why: the W4A8 grouped GEMM of dsv4.kernels.moe sums each 32-wide K group in its own MMA (f16 operands,
mma.sync) and rescales the accumulator per group; at prefill sizes that runs at ≈ 11-14 % of the FP8
peak (docs/benchmarks.md #5). Here every operand value the reference multiplies is held exactly in bf16
instead, so one accumulation chain covers the whole K range on wgmma:

    activation   e4m3 code * pow2 row scale (act_quant, per 128)   -> exact in bf16 (4 significant bits)
    weight       e2m1 code * E8M0 group scale (per 32)             -> exact in bf16 (2 significant bits)
    product      exact in fp32 (6 significant bits); the sum is fp32 in the MMA's order

so the results are the reference's products summed in fp32 (another order than the per-group kernel;
same contract as `fused_moe_ref`). The weights are widened in registers by bit moves (`_e2m1_f32`) and
one multiply by the group scale, and are the MMA's M side (`acc[BN, BM]`, the wgmma A operand from
registers); the activation rows (bf16, dequantised once per call) are the N side. Each 32-wide group is
one dot into the same accumulator: 32 bytes of a packed row hold two whole groups (`moe_layout.repack_fp4`),
low nibbles and high. The widening needs group scales <= 2^1 (byte <= 128; `PackedExperts.wide_ok`, true
for released checkpoints); `fused_moe` falls back to the per-group kernel otherwise.

GEMM1 (w13, gate and up) ends in the SwiGLU clamp, routing weight and the W2 input quantisation (per
row and 128 channels, the reference's act_quant); it stores the quantised z dequantised to bf16, again
exact. GEMM2 (w2) writes one bf16 row per (token, slot); `moe.fused_moe` then runs the usual combine.
"""
from __future__ import annotations

import functools

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, interpreted, tl, triton
from dsv4.kernels.moe_layout import BLOCK, PackedExperts

# The Triton kernel's widening: through f16 (4 nibbles per word op, cvt f16 -> f32) instead of one fp32 per
# byte: fewer integer ops per weight. Flash MoE on the H200 (bench/runs/run_device_s9a.sh), fp32 vs f16
# widening: M = 4096 6.33 -> 5.51 ms, M = 8192 12.18 -> 10.50 ms
WIDEN_F16 = True
# The same GEMMs with the widening overlapped with asynchronous wgmma (dsv4.kernels.moe_wide_async, Gluon),
# bit-identical. Flash MoE, ms L2-flushed (bench/runs/run_device_s10d.sh), Triton kernel -> Gluon:
# 128-row tiles, weights through shared memory, 4 ring slots: M = 4096 5.53 -> 4.86, M = 8192 10.53 -> 9.30;
# 64-row tiles, weights in registers: M = 2048 4.18 (s10c) -> 3.79 (the shared-memory mode: 4.04). The Gluon
# kernels widen by their own bf16x2 bit moves (session 27), whatever WIDEN_F16 says
ASYNC = True
# Launch order of the Gluon kernel's programs: ASYNC_GROUP_M blocks of rows x every column tile, then the next
# blocks (0: row block fastest, i.e. one column tile over all experts' blocks before the next). Nsight Compute
# (s13e, Flash, 8K tokens): with row blocks fastest the GLU read 10 GB from HBM for 2.1 GB of weights and
# 0.4 GB of activations -- each 1 MB activation block came back from HBM for each of its 32 column tiles
ASYNC_GROUP_M = 4
ASYNC_STAGES = 4  # ring slots of 64-wide K halves (activations and weight bytes) in shared memory
# the Gluon kernel's epilogue through shared memory so each thread stores 16 contiguous bytes (the accumulator
# layout's neighbours are rows apart: 16-bit stores). s32d: bit-identical; Flash MoE call -2 % at 2K, -4 % at 8K
ASYNC_STORE_T = True
ASYNC_A_SMEM: bool | None = None  # widened weights through shared memory (None: two warpgroups, >= 128-row tiles)
# ... with one warpgroup per program (64 weight rows, 4 warps, the widened weights as the MMA's register
# operand; two programs per SM, whose widening and MMAs interleave without synchronising) instead of two in
# lockstep; the GLU then stores z unquantised and `requant_rows` quantises it per 128 channels. Per GEMM
# (bench/bench_moe_wide_shapes.py, bench/runs/run_device_s11a.sh, ms L2-flushed, two warpgroups -> one):
# GLU M = 2048 (64-row tiles) 2.38 -> 1.84, M = 4096 3.09 -> 2.62, M = 8192 6.14 -> 5.54; GEMM2 the other
# way: 1.11 -> 1.36, 1.45 -> 2.39, 2.83 -> 4.31. So the GLU runs on one warpgroup, GEMM2 on two
GLU_ONE_WARPGROUP = True
# Removed in session 77 after measuring no gain (docs/benchmarks.md "Session 77"): the GLU's epilogue storing z's
# e4m3 codes and per-128 scales for the FP8 down GEMM instead of the bf16 z that act_quant reads back -- on 128-channel
# tiles (two warpgroups; s75b, H100, Flash MoE call at 8K: 6.474 ms against the default's 6.008) and on the
# one-warpgroup GLU's 64-channel tiles by the 128-channel block's last program to arrive (s77e/s77f: 8K 6.049 vs
# 6.053, 16K 10.768 vs 10.720: the ≈ 300 MB of z it saves did not show)
DOWN_ONE_WARPGROUP = False
# Removed in session 41 after measuring slower: a warp-specialized bf16 GLU (`moe_bf16_ws`: two producer partitions
# widening alternate 64-wide K halves into shared memory, two consumer warpgroups issuing only MMAs, 128 tokens x
# 128 gate + 128 up channels per program; bit-identical): Flash MoE call at 8K 6.70-6.81 vs 5.77 ms, Nsight 44 %
# tensor pipe vs this GLU's 58.5 % -- the widened weights' round trip through shared memory (docs/benchmarks.md)
# Removed in session 36 after measuring slower (docs/benchmarks.md): session 11's FP8 kernel with per-row 128-wide
# block scales (`moe_wide_fp8`, 1.5-2x slower: twice the re-encode per token, two multiplies of promotion) and
# session 28's warp-specialised GEMMs (`moe_wide_ws`, s29a: Flash MoE call at 8K 9.19 ms with its GLU vs 6.87; the
# partitions added up instead of overlapping)
# The GLU on FP8 tensor cores (dsv4.kernels.moe_glu_fp8, Gluon: 128 tokens x 64 channels per program, the weights
# re-encoded per 64-row tile, one FMA of promotion per element). Slower than the bf16 GLU (s35d, Flash MoE call, ms
# L2-flushed, default vs FP8 GLU only: M = 2048 2.14 vs 2.43, 4096 3.42 vs 3.65, 8192 6.17 vs 6.76; Nsight: 35 %
# issue-active, latency-bound at two warps per scheduler), so opt-in
FP8_GLU = False
# ... and the down GEMM the same way (z quantised by act_quant: codes and per-128 scales), from
# FP8_DOWN_MIN_PAIRS_PER_EXPERT pairs per expert. Flash MoE call, ms L2-flushed, default (bf16 down) vs FP8 down:
# s35d M = 2048 (48 pairs per expert) 2.14 vs 2.12, 4096 (96) 3.42 vs 3.30, 8192 6.17 vs 6.04; s35e M = 1024 2.09
# vs 2.07, 2048 2.14 vs 2.19, 8192 6.22 vs 5.94, 16384 11.78 vs 10.91; Pro (384 experts) M = 2048 (32) 7.61 vs 7.82,
# 8192 (128) 17.69 vs 16.76; 8 Flash layers' 8K prefill 98-99 -> 94-97 ms. The block sums are the FP8 MMA's with
# the per-128 promotion, as in DeepSeek's FP8 GEMMs: 91 % of outputs bit-identical to the bf16 down, rel 1.1e-3
FP8_DOWN = True
FP8_DOWN_MIN_PAIRS_PER_EXPERT = 96
# The Gluon GLU's weight pairs read in `moe_wide_async.pair_view` order PERM_K (0: as stored, 16-bit loads; 1:
# 32-bit loads; 2: 64-bit loads), the activation's columns permuted to match by `dequantized_act` (its launch
# exists anyway). 1 keeps each wgmma's set of k (bit-identical to 0); 2 moves k between the two wgmmas of a 32-wide
# group, so the fp32 sums change order (99.99 % of outputs bit-identical to 0). Flash MoE call, ms (H200, s32d,
# one call, after the requant store fix): M = 2048 0: 2.318 / 2.418, 2: 2.197 / 2.263; M = 8192 0: 6.898 / 6.973,
# 2: 6.808 / 6.779 (s31e's figures had 16-bit requant stores on both sides)
PERM_K = 2

if HAS_TRITON:
    from dsv4.kernels.fp8_linear import _quant_rows, _to_bf16
    from dsv4.kernels.moe import _block_pairs
    from dsv4.kernels.moe_mma_operands import _f16_hi, _f16_lo

    def _e2m1_asm(hi: bool) -> str:
        """PTX for 4 bytes -> 4 fp32 (`_e2m1_f32`): prmt moves byte k to the top, then shift/mask/or."""
        if hi:
            body = "shr.u32 m, t, 6; and.b32 m, m, 0x01C00000; and.b32 s, t, 0x80000000; or.b32 {o}, m, s; "
        else:
            body = "shr.u32 m, t, 2; and.b32 m, m, 0x01C00000; shl.b32 s, t, 4; and.b32 s, s, 0x80000000; " \
                   "or.b32 {o}, m, s; "
        return "{ .reg .b32 t, m, s, z; mov.b32 z, 0; " + "".join(
            f"prmt.b32 t, $4, z, 0x{k}444; " + body.format(o=f"${k}") for k in range(4)) + "}"

    _ASM_LO: tl.constexpr = tl.constexpr(_e2m1_asm(False))
    _ASM_HI: tl.constexpr = tl.constexpr(_e2m1_asm(True))

    @triton.jit
    def _e2m1_f32(b, HI: tl.constexpr, USE_ASM: tl.constexpr):
        """uint8 bytes -> fp32 e2m1(code) * 2^-126 of their low (or high) nibbles, by bit moves: the code's
        3 magnitude bits become the exponent's low 2 bits and the top mantissa bit (code 1 = 0.5 lands
        on the subnormal 2^-127), the sign bit the sign."""
        if USE_ASM:
            if HI:
                return tl.inline_asm_elementwise(_ASM_HI, "=r,=r,=r,=r,r", [b], dtype=tl.float32, is_pure=True,
                                                 pack=4)
            else:
                return tl.inline_asm_elementwise(_ASM_LO, "=r,=r,=r,=r,r", [b], dtype=tl.float32, is_pure=True,
                                                 pack=4)
        else:
            c = b.to(tl.int32)
            if HI:
                c = c >> 4
            return (((c & 7) << 22) | ((c & 8) << 28)).to(tl.float32, bitcast=True)

    @triton.jit
    def _scale(sc, g, F16: tl.constexpr):
        """fp32 2^(b - 1) (F16: 2^(b - 113)) of byte g (constant or not) of the packed E8M0 word: times
        `_e2m1_f32`'s 2^-126 (moe_gemv `_f16_lo/_hi`'s 2^-14), the group scale 2^(b - 127). Needs b <= 128
        (`PackedExperts.wide_ok`)."""
        b = (sc >> (8 * g)) & 0xFF
        if F16:
            return ((b + 14) << 23).to(tl.float32, bitcast=True)
        return ((b + 126) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _widen(wb, sc, g: tl.constexpr, HI: tl.constexpr, USE_ASM: tl.constexpr, F16: tl.constexpr):
        """bf16 [BN, 32] weights of group g from their packed bytes: exact, the group scale folded in."""
        if F16:  # the decode path's e2m1 -> f16 bit moves (4 nibbles per word op)
            if HI:
                w = _f16_hi(wb, USE_ASM).to(tl.float32)
            else:
                w = _f16_lo(wb, USE_ASM).to(tl.float32)
        else:
            w = _e2m1_f32(wb, HI, USE_ASM)
        return (w * _scale(sc, g, F16)[:, None]).to(tl.bfloat16)

    @triton.jit
    def _group_dot(acc, wb, sc, a, g: tl.constexpr, HI: tl.constexpr, USE_ASM: tl.constexpr, INTERP: tl.constexpr,
                   F16: tl.constexpr):
        """acc[BN, BM] += W_g · a^T for one 32-wide group g (`_widen`). (Triton's CPU interpreter
        mis-multiplies bf16 made inside a kernel: fp32 there.)"""
        w = _widen(wb, sc, g, HI, USE_ASM, F16)
        if INTERP:
            return tl.dot(w.to(tl.float32), tl.trans(a).to(tl.float32), acc)
        return tl.dot(w, tl.trans(a), acc)

    @triton.jit
    def _block_dot(acc, w_ptrs, s_ptrs, a_ptrs, kb, valid, USE_ASM: tl.constexpr, INTERP: tl.constexpr,
                   F16: tl.constexpr):
        """acc += one 128-wide K block: per 64-wide half h, 32 weight bytes per row hold group 2h (low
        nibbles) and 2h + 1 (high); each group is one bf16 dot against its 32 activation columns."""
        sc = tl.load(s_ptrs + kb)
        for h in tl.static_range(2):
            wb = tl.load(w_ptrs + kb * 64 + h * 32)
            a_lo = tl.load(a_ptrs + kb * 128 + h * 64, mask=valid[:, None], other=0.0)
            a_hi = tl.load(a_ptrs + kb * 128 + h * 64 + 32, mask=valid[:, None], other=0.0)
            acc = _group_dot(acc, wb, sc, a_lo, 2 * h, False, USE_ASM, INTERP, F16)
            acc = _group_dot(acc, wb, sc, a_hi, 2 * h + 1, True, USE_ASM, INTERP, F16)
        return acc

    @triton.jit(do_not_specialize=["num_pairs", "top_k"])
    def _wide_kernel(
        A, W, WS, C, SORTED, EXPERT_IDS, NUM_POST, TOPK_W,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm,
        BM: tl.constexpr, BN: tl.constexpr, GLU: tl.constexpr, USE_ASM: tl.constexpr, INTERP: tl.constexpr,
        F16: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        if pid_m * BM >= tl.load(NUM_POST):
            return
        # GLU: x rows gathered by token; GEMM2 reads z in sorted order
        e, offs_p, pair, valid, rows = _block_pairs(pid_m, EXPERT_IDS, SORTED, num_pairs, top_k, BM, GLU)
        rows = rows.to(tl.int64)
        offs_n = pid_n * BN + tl.arange(0, BN)
        j = tl.arange(0, 32)
        a_ptrs = A + rows[:, None] * stride_am + j[None, :]
        w_ptrs = W + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wn + j[None, :]
        s_ptrs = WS + e * stride_wse + offs_n.to(tl.int64) * stride_wsn
        acc = tl.zeros((BN, BM), dtype=tl.float32)
        acc_u = tl.zeros((BN, BM), dtype=tl.float32)
        for kb in range(0, K // 128):
            acc = _block_dot(acc, w_ptrs, s_ptrs, a_ptrs, kb, valid, USE_ASM, INTERP, F16)
            if GLU:
                acc_u = _block_dot(acc_u, w_ptrs + up_off * stride_wn, s_ptrs + up_off * stride_wsn, a_ptrs, kb,
                                   valid, USE_ASM, INTERP, F16)
        acc = tl.trans(acc)  # [BM, BN]
        if GLU:
            gate = tl.minimum(_to_bf16(acc, INTERP).to(tl.float32), limit)
            up = tl.clamp(_to_bf16(tl.trans(acc_u), INTERP).to(tl.float32), -limit, limit)
            rw = tl.load(TOPK_W + pair, mask=valid, other=0.0)
            z = _to_bf16((gate / (1.0 + tl.exp(-gate)) * up) * rw[:, None], INTERP)
            q, s = _quant_rows(z.to(tl.float32))  # BN == 128: one quantisation block of W2's input
            zq = (q.to(tl.float32) * s[:, None]).to(tl.bfloat16)  # exact
            tl.store(C + offs_p.to(tl.int64)[:, None] * stride_cm + offs_n[None, :], zq)
        else:
            c_ptrs = C + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, _to_bf16(acc, INTERP), mask=valid[:, None])


if HAS_TRITON:
    @triton.jit
    def _mixed_tiles_kernel(EIDS, T128, T64, nb, n128, n64, NB_POW2: tl.constexpr, E_POW2: tl.constexpr):
        """`mixed_tiles_ref` in one program: each block's place in its expert's run (runs consecutive, in
        ascending expert order from block 0), then the two lists compacted by prefix sums, -1 after them."""
        b = tl.arange(0, NB_POW2)
        e = tl.load(EIDS + b, mask=b < nb, other=-1)
        valid = e >= 0
        ec = tl.where(valid, e, 0)
        count = tl.histogram(ec, E_POW2, mask=valid)  # blocks per expert
        run = tl.gather(count, ec, 0)
        idx = b - tl.gather(tl.cumsum(count, 0) - count, ec, 0)  # the block's place in its run
        first = valid & (idx % 2 == 0)
        pair = first & (run - idx >= 2)
        odd = first & (run - idx == 1)
        k128 = tl.cumsum(pair.to(tl.int32), 0)
        k64 = tl.cumsum(odd.to(tl.int32), 0)
        tl.store(T128 + k128 - 1, b, mask=pair)
        tl.store(T64 + k64 - 1, b, mask=odd)
        tl.store(T128 + b, -1, mask=(b >= tl.max(k128, 0)) & (b < n128))
        tl.store(T64 + b, -1, mask=(b >= tl.max(k64, 0)) & (b < n64))

    @triton.jit
    def _requant_kernel(Z, OUT, n_rows, stride, stride_out, BR: tl.constexpr, PERM: tl.constexpr):
        """Rows [BR] x one 128-wide block of z -> out (may be z only with PERM 0): act_quant's e4m3 with a pow2
        scale, dequantised, its columns in `permute_pairs` order PERM (within the 128-wide block)."""
        r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
        c = tl.program_id(1) * 128 + tl.arange(0, 128)
        mask = (r < n_rows)[:, None]
        z = tl.load(Z + r[:, None] * stride + c[None, :], mask=mask, other=0.0).to(tl.float32)
        q, s = _quant_rows(z)
        v = (q.to(tl.float32) * s[:, None]).to(tl.bfloat16)
        if PERM > 0:  # column run + 2 (2^PERM p + i) + e goes to run + 2 (p + 4 i) + e, permuted in registers so
            # the store stays contiguous (s32c: per-element destinations made 16-bit stores, +0.9 ms per 2K call)
            N: tl.constexpr = 1 << PERM
            v = tl.reshape(tl.permute(tl.reshape(v, [BR, 128 // (8 * N), 4, N, 2]), (0, 1, 3, 2, 4)), [BR, 128])
        tl.store(OUT + r[:, None] * stride_out + c[None, :], v, mask=mask)


def requant_rows(z: torch.Tensor, br: int = 32, out: torch.Tensor | None = None, perm: int = 0) -> torch.Tensor:
    """z [R, C] bf16 (C a multiple of 128) -> the reference's FP8 activation quantisation of it, dequantised
    (`dequantized_act`'s values), in place (no second buffer) or into out (z unchanged), its columns in
    `permute_pairs` order perm (0, 1 or 2; not in place)."""
    if z.dtype != torch.bfloat16 or z.dim() != 2 or z.shape[1] % BLOCK or z.stride(1) != 1:
        raise ValueError(f"requant_rows: expected bf16 [R, 128 k] with unit column stride, got {z.dtype} "
                         f"{tuple(z.shape)}")
    if perm not in (0, 1, 2) or (perm and (out is None or out.data_ptr() == z.data_ptr())):
        raise ValueError(f"requant_rows: perm {perm} must be 0, 1 or 2, and a permuting one needs its own out")
    out = z if out is None else out
    if out.dtype != torch.bfloat16 or out.shape != z.shape or out.stride(1) != 1:
        raise ValueError(f"requant_rows: out must be bf16 {tuple(z.shape)} with unit column stride")
    if z.shape[0]:
        _requant_kernel[(triton.cdiv(z.shape[0], br), z.shape[1] // BLOCK)](z, out, z.shape[0], z.stride(0),
                                                                            out.stride(0), BR=br, PERM=perm)
    return out


def dequantized_act(x: torch.Tensor, perm: int = 0) -> torch.Tensor:
    """The reference's FP8 activation (act_quant: e4m3 per row and 128 channels, pow2 scales) as exact
    bf16 values [M, K], in one launch (was act_quant + three torch ops: 277 µs at 8K tokens, s12d), its
    columns in `permute_pairs` order perm."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    return requant_rows(x, out=torch.empty_like(x, memory_format=torch.contiguous_format), perm=perm)


def permute_pairs(x: torch.Tensor, perm: int) -> torch.Tensor:
    """x [..., K] with its columns in `moe_wide_async.pair_view` order perm (the reference for
    `requant_rows(perm=)`): within each run of 4 * 2^perm column pairs, pair 2^perm p + i moves to p + 4 i."""
    n = 1 << perm
    return x.unflatten(-1, (-1, 4, n, 2)).transpose(-3, -2).flatten(-4).contiguous()


def dequantized_act_ref(x: torch.Tensor) -> torch.Tensor:
    """`dequantized_act` from `act_quant`'s codes and scales (the two-step form, for the tests)."""
    from dsv4.kernels.fp8_linear import act_quant

    q, s = act_quant(x)
    m, k = q.shape
    return (q.view(m, k // BLOCK, BLOCK).float() * s[..., None]).to(torch.bfloat16).view(m, k)


@functools.lru_cache(maxsize=None)
def _is_hopper(device: torch.device) -> bool:
    """wgmma (the Gluon kernel's MMA) exists on sm_90 only; elsewhere the Triton kernel's tl.dot runs."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def gluon_path(device: torch.device) -> bool:
    """Whether `moe_wide` runs the Gluon kernels (moe_wide.ASYNC; wgmma is Hopper's; no interpreter for Gluon),
    the only ones that take mixed tiles."""
    return ASYNC and not INTERPRET and _is_hopper(device)


def fp8_glu_path(experts: PackedExperts, device: torch.device) -> bool:
    """Whether `moe_wide`'s GLU runs on FP8 operands (FP8_GLU, the Gluon path, tiles that re-encode exactly)."""
    return FP8_GLU and experts.fmt == "mxfp4" and experts.fp8_tiles_ok and gluon_path(device)


def fp8_down_path(experts: PackedExperts, device: torch.device, num_pairs: int) -> bool:
    """Whether `moe_wide`'s down GEMM runs on FP8 operands (FP8_DOWN from FP8_DOWN_MIN_PAIRS_PER_EXPERT (token, slot)
    pairs per expert, as `pick_moe_config` counts them; as `fp8_glu_path`, for w2)."""
    many = num_pairs >= FP8_DOWN_MIN_PAIRS_PER_EXPERT * experts.num_experts
    return FP8_DOWN and many and experts.fmt == "mxfp4" and experts.fp8_w2_tiles_ok and gluon_path(device)


def _fp8_gemm(x: torch.Tensor, args: tuple, experts: PackedExperts, tiles: list, top_k: int, limit: float,
              glu: bool, requant: bool):
    """One of `moe_wide`'s GEMMs on FP8 operands (dsv4.kernels.moe_glu_fp8) with args's output and routing
    (`launch_args`): glu, x the tokens, z stored unquantised, then quantised per 128 for a bf16 down GEMM if
    requant; else x is z, quantised here (act_quant) for the FP8 down GEMM into y."""
    from dsv4.kernels import moe_glu_fp8
    from dsv4.kernels.fp8_linear import act_quant

    xq, xs = act_quant(x)
    out, sorted_ids, expert_ids, num_post, tw = args[3:8]
    w, sw, tb = (experts.w13, experts.w13_scale, experts.w13_tile_bmax) if glu else \
        (experts.w2, experts.w2_scale, experts.w2_tile_bmax)
    for tile_m, tile_list, rows in tiles:
        moe_glu_fp8.launch(xq, xs, w, sw, tb, out, sorted_ids, expert_ids, num_post, tw, top_k, limit, rows, tile_m,
                           glu, ASYNC_GROUP_M, tile_list)
    if glu and requant:
        requant_rows(out)


def mixed_tiles(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`mixed_tiles_ref` in one Triton launch (≈ 25 torch ops otherwise: ≈ 250 µs of host time per call at 8K
    tokens, s29f) where MIXED_TILES_KERNEL and the block table fits one program; else the reference."""
    nb = expert_ids.numel()
    if not (MIXED_TILES_KERNEL and HAS_TRITON and (expert_ids.is_cuda or interpreted()) and 0 < nb <= 16384):
        return mixed_tiles_ref(expert_ids, num_experts)
    n128, n64 = nb // 2, min(num_experts, nb)
    big = torch.empty(n128, dtype=torch.int32, device=expert_ids.device)
    small = torch.empty(n64, dtype=torch.int32, device=expert_ids.device)
    _mixed_tiles_kernel[(1,)](expert_ids, big, small, nb, n128, n64, NB_POW2=triton.next_power_of_2(nb),
                              E_POW2=triton.next_power_of_2(num_experts), num_warps=8)
    return big, small


# the mixed tile lists by `_mixed_tiles_kernel` (one launch) instead of ≈ 25 torch ops (GPU-tested s30c; figures at
# moe_align.LARGE)
MIXED_TILES_KERNEL = True


def mixed_tiles_ref(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`moe_wide(mixed=True)`'s tile lists from `moe_align(.., 64)`'s expert_ids (int32 [nb], one expert's blocks
    consecutive, -1 past the last used): (first blocks of the 128-row tiles, int32 [nb // 2]: blocks 2j and 2j + 1
    of each expert's segment; first blocks of the 64-row tiles, int32 [min(E, nb)]: each expert's odd last
    block), ascending, padded with -1. Device ops of fixed sizes (no host sync: CUDA graphs can hold them)."""
    nb, dev = expert_ids.numel(), expert_ids.device
    valid = expert_ids >= 0
    e = expert_ids.long().clamp(min=0)
    count = torch.zeros(num_experts, dtype=torch.long, device=dev).scatter_add_(0, e, valid.long())
    idx = torch.arange(nb, device=dev) - (torch.cumsum(count, 0) - count)[e]  # the block's place in its segment
    first = valid & (idx % 2 == 0)
    left = count[e] - idx  # blocks of the segment from this one on
    return _compact(first & (left >= 2), nb // 2), _compact(first & (left == 1), min(num_experts, nb))


def _compact(mask: torch.Tensor, size: int) -> torch.Tensor:
    """int32 [size]: the indices where mask holds (at most size of them), ascending, then -1s."""
    pos = torch.where(mask, torch.cumsum(mask, 0) - 1, size)  # the others go to a dropped spare slot
    out = torch.full((size + 1,), -1, dtype=torch.int32, device=mask.device)
    out.scatter_(0, pos, torch.arange(mask.numel(), dtype=torch.int32, device=mask.device))
    return out[:size]


def launch_args(x: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, num_post: torch.Tensor,
                topk_weights: torch.Tensor, top_k: int, experts: PackedExperts, swiglu_limit: float,
                bm: int, perm: int = 0, act: bool = True) -> tuple[tuple, tuple, torch.Tensor]:
    """The two GEMMs' kernel arguments (up to the constexprs; `_wide_kernel`'s order, which the Gluon kernel
    shares) and the output y [pairs, D] they fill; GEMM1 reads the dequantised FP8 activation (its columns in
    `permute_pairs` order perm; act False: x itself, for a GLU that quantises on its own), writes z."""
    d, i = experts.hidden, experts.inter
    num_pairs, nb = topk_weights.numel(), expert_ids.numel()
    xq = dequantized_act(x, perm) if act else x
    z = torch.empty((nb * bm, i), dtype=torch.bfloat16, device=x.device)
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    w13, s13, w2, s2 = experts.w13, experts.w13_scale, experts.w2, experts.w2_scale
    args1 = (xq, w13, s13, z, sorted_ids, expert_ids, num_post, tw, d, num_pairs, top_k, i, float(swiglu_limit),
             xq.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), z.stride(0))
    y = torch.empty((num_pairs, d), dtype=torch.bfloat16, device=x.device)
    args2 = (z, w2, s2, y, sorted_ids, expert_ids, num_post, tw, i, num_pairs, top_k, 0, float(swiglu_limit),
             z.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), y.stride(0))
    return args1, args2, y


def moe_wide(x: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, num_post: torch.Tensor,
             topk_weights: torch.Tensor, top_k: int, experts: PackedExperts, swiglu_limit: float,
             bm: int = 64, bn2: int = 128, num_warps: int = 8, num_stages: int = 3, maxnreg: int = 0,
             mixed: bool = False) -> torch.Tensor:
    """The two grouped GEMMs on `moe_align(topk_ids, E, bm)`'s blocks: bf16 x [M, D], MXFP4 experts ->
    y [pairs, D] bf16, one row per (token, slot) (rows of other ranks' pairs are left unwritten).
    mixed (bm 64, Gluon kernels only): 128-row tiles over each expert's pairs of 64-row blocks and a 64-row tile
    for an odd last block (`mixed_tiles`), so an expert's padding is under 64 rows, not under 128."""
    if experts.fmt != "mxfp4" or not experts.wide_ok:
        raise ValueError("moe_wide: needs MXFP4 experts with scale bytes <= 128 (PackedExperts.wide_ok)")
    if bm not in (16, 32, 64, 128, 256) or bn2 not in (64, 128):
        raise ValueError(f"moe_wide: bm must be a power of two in 16..256 and bn2 64 or 128, got {bm}, {bn2}")
    if mixed and (bm != 64 or not gluon_path(x.device)):
        raise ValueError(f"moe_wide: mixed tiles need 64-row blocks (got bm {bm}) and the Gluon kernels (a Hopper "
                         "GPU, moe_wide.ASYNC)")
    gluon = gluon_path(x.device)
    fp8_glu, fp8_down = fp8_glu_path(experts, x.device), fp8_down_path(experts, x.device, topk_weights.numel())
    perm = PERM_K if gluon else 0
    args1, args2, y = launch_args(x, sorted_ids, expert_ids, num_post, topk_weights, top_k, experts, swiglu_limit, bm,
                                  perm, act=not fp8_glu)
    d, i, nb = experts.hidden, experts.inter, expert_ids.numel()
    if gluon:
        from dsv4.kernels import moe_wide_async
        tiles = [(bm, None, nb)]
        if mixed:
            big, small = mixed_tiles(expert_ids, experts.num_experts)
            tiles = [(128, big, big.numel()), (64, small, small.numel())]
        for a, n, glu, one, bn in ((args1, i, True, GLU_ONE_WARPGROUP, BLOCK),
                                   (args2, d, False, DOWN_ONE_WARPGROUP, bn2)):
            if fp8_glu if glu else fp8_down:
                _fp8_gemm(x if glu else a[0], a, experts, tiles, top_k, swiglu_limit, glu, requant=not fp8_down)
                continue
            bn, warps = (64, 4) if one else (bn, num_warps)
            for tile_m, tile_list, rows in tiles:
                a_smem = (tile_m >= 128 and not one) if ASYNC_A_SMEM is None else ASYNC_A_SMEM
                moe_wide_async.launch(a, (rows, n // bn), tile_m, bn, glu, warps, ASYNC_STAGES, a_smem, ASYNC_GROUP_M,
                                      tiles=tile_list, perm=perm if glu else 0, store_t=ASYNC_STORE_T)
            if glu and bn != BLOCK and not fp8_down:  # z was stored unquantised
                requant_rows(args1[3])
        return y
    meta = dict(BM=bm, INTERP=INTERPRET, USE_ASM=not INTERPRET, F16=WIDEN_F16, num_warps=num_warps,
                num_stages=num_stages)
    if maxnreg and not INTERPRET:
        meta["maxnreg"] = maxnreg
    _wide_kernel[(nb, i // BLOCK)](*args1, BN=BLOCK, GLU=True, **meta)
    _wide_kernel[(nb, d // bn2)](*args2, BN=bn2, GLU=False, **meta)
    return y
