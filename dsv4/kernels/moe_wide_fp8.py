"""The prefill MoE's two grouped GEMMs on FP8 tensor cores (Gluon), MXFP4 experts re-encoded per 128-wide K block.

Why: `moe_wide_async` issues bf16 MMAs, so #5's target (50 % of the FP8 peak) would need 78 % of the bf16 peak
in useful FLOPs. Here both operands are e4m3, as in the reference's FP8 block GEMM with its per-128 promotion:

    activation   the e4m3 codes of act_quant (per row and 128 channels) and their pow2 scale sa[row, block]
    weight       e2m1 code * 2^(b_g - 127) per 32-group g  ==  e4m3(e2m1(code) * 2^(6 - d_g)) * 2^(bmax - 133)
                 with bmax the block's largest scale byte and d_g = bmax - b_g: exact while d_g <= 11 and
                 bmax >= 7 (`PackedExperts.fp8_ok`; the e4m3 bytes come from a prmt table, `_e2m1_e4m3`)
    block sum    one chain of FP8 wgmmas over the 128-wide block from a zero accumulator (the tensor core's
                 own accumulation), then acc += p * 2^(bmax - 133)[row] * sa[token] in fp32 (the promotion)

So the products are the reference's exactly and each block's sum is the FP8 MMA's (not the fp32 order of
`fused_moe_ref`: statistical tests). The weights are re-encoded by the CUDA cores into a 2-slot shared-memory
buffer while the tensor cores run the previous block; a cp.async ring of STAGES slots brings each block's
activation codes and packed weight bytes. Blocks go in pairs (the two accumulators alternate statically, so
no register copies land on an in-flight accumulator); the last pair's second MMA is a repeat of the last
block, computed and never promoted (odd block counts only).

GEMM1 (w13) ends in the SwiGLU clamp, routing weight and W2's input quantisation (per pair and 128 channels,
BN == 128), storing z as e4m3 codes + scales; GEMM2 (w2) reads them and writes bf16 rows per (token, slot).

Status: correct on the H200 (s11b, s11i) but 1.5-2x slower than the bf16-MMA default; opt-in
(`moe_wide.WIDE_FP8`). See moe_wide.WIDE_FP8 for the numbers and why.
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

# e4m3 bytes of the e2m1 magnitudes 0, .5, 1, 1.5 (low word) and 2, 3, 4, 6 (high word) times 2^6: the prmt
# table of a group at its block's largest scale; a group 2^-d below it takes d off every nonzero byte's
# exponent field (exact for d <= FP8_MAX_SCALE_SPREAD: the smallest, 0.5 * 2^6 * 2^-11 = 2^-6, stays normal)
T8_LO = 0x6C686000
T8_HI = 0x7C787470


def e4m3_pair_asm() -> str:
    """PTX for 4 packed bytes ($2) -> the e4m3 bytes of their 4 low nibbles ($0) and of their 4 high nibbles ($1)
    (`_e2m1_e4m3`). The two groups' prmt tables come precomputed per row (T8 less d per exponent field): low
    nibbles $3 / $7, high nibbles $11 / $15 (each int32 operand is 4 copies of one value, so operand 4i+3 is
    the i-th table word). Per nibble set: the 4 magnitudes gathered into one 16-bit prmt selector (and, shift,
    or, prmt), the lookup, the sign bits moved to bit 7. SASS of the GLU loop: ~1.7 instructions per weight
    (the session-10 form, one nibble set per call: ~2.1)."""
    lookup = ("and.b32 m, m, 0x07070707; shr.b32 t, m, 4; or.b32 m, m, t; prmt.b32 m, m, 0, 0x20; "
              "prmt.b32 r, {lo}, {hi}, m; ")
    return ("{ .reg .b32 m, t, r; mov.b32 m, $2; " + lookup.format(lo="$3", hi="$7") +
            "shl.b32 t, $2, 4; and.b32 t, t, 0x80808080; or.b32 $0, r, t; "
            "shr.b32 m, $2, 4; " + lookup.format(lo="$11", hi="$15") +
            "and.b32 t, $2, 0x80808080; or.b32 $1, r, t; }")


if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from dsv4.kernels.fp8_linear import _pow2_scale
    from dsv4.kernels.moe_wide_async import block_rows

    _ASM8_PAIR: gl.constexpr = gl.constexpr(e4m3_pair_asm())
    _T8_LO: gl.constexpr = gl.constexpr(T8_LO)
    _T8_HI: gl.constexpr = gl.constexpr(T8_HI)

    @gluon.jit
    def _e2m1_e4m3(b, d_lo, d_hi):
        """uint8 [BN, 32] packed bytes -> (e4m3 e2m1(code) * 2^(6 - d_lo) of their low nibbles, the same of their
        high nibbles with d_hi); d_lo, d_hi [BN] int32 in 0..11 per row, turned into each row's tables here."""
        zero = b.to(gl.int32) * 0
        tla = zero + (_T8_LO - d_lo * 0x08080800)[:, None]  # (byte 0, code 0, stays 0)
        tha = zero + (_T8_HI - d_lo * 0x08080808)[:, None]
        tlb = zero + (_T8_LO - d_hi * 0x08080800)[:, None]
        thb = zero + (_T8_HI - d_hi * 0x08080808)[:, None]
        return gl.inline_asm_elementwise(_ASM8_PAIR, "=r,=r" + ",r" * 17, [b, tla, tha, tlb, thb],
                                         dtype=(gl.float8e4nv, gl.float8e4nv), is_pure=True, pack=4)

    @gluon.jit
    def _bmax(sc):
        """The largest of the 4 E8M0 bytes of each packed scale word."""
        return gl.maximum(gl.maximum(sc & 0xFF, (sc >> 8) & 0xFF), gl.maximum((sc >> 16) & 0xFF, (sc >> 24) & 0xFF))

    @gluon.jit
    def _issue_block(x_s, w_s, u_s, sa_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sa_ptrs, sa_mask, kb, nblocks,
                     STAGES: gl.constexpr, GLU: gl.constexpr):
        """cp.async of K block kb (activation codes [BM, 128] and their scales [BM], packed weight bytes
        [BN, 64]) into ring slot kb % STAGES; one commit group per block (empty past the end)."""
        if kb < nblocks:
            slot = kb % STAGES
            async_copy.async_copy_global_to_shared(x_s.index(slot), x_ptrs + kb * 128, mask=x_mask)
            if GLU:  # (the token scales: GLU only, see `_promote`)
                async_copy.async_copy_global_to_shared(sa_s.index(slot), sa_ptrs + kb, mask=sa_mask)
            async_copy.async_copy_global_to_shared(w_s.index(slot), wc_ptrs + kb * 64)
            if GLU:
                async_copy.async_copy_global_to_shared(u_s.index(slot), uc_ptrs + kb * 64)
        async_copy.commit_group()

    @gluon.jit
    def _encode(w_s, wa_s, slot, wslot, sc, c_l: gl.constexpr):
        """Block's packed bytes (ring slot) -> e4m3 [BN, 128] in weight slot wslot (K order: half h's low
        nibbles are k 64h..64h+31, its high nibbles k 64h+32..64h+63)."""
        bmax = _bmax(sc)
        for h in gl.static_range(2):
            wb = w_s.index(slot).slice(32 * h, 32, dim=1).load(c_l)
            d_lo = bmax - ((sc >> (16 * h)) & 0xFF)
            d_hi = bmax - ((sc >> (16 * h + 8)) & 0xFF)
            lo, hi = _e2m1_e4m3(wb, d_lo, d_hi)
            wa_s.index(wslot).slice(64 * h, 32, dim=1).store(lo)
            wa_s.index(wslot).slice(64 * h + 32, 32, dim=1).store(hi)

    @gluon.jit
    def _stage(x_s, w_s, u_s, sa_s, wa_s, wu_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sa_ptrs, sa_mask, sc_ptrs,
               suc_ptrs, kb, nblocks, wslot, c_l: gl.constexpr, GLU: gl.constexpr, STAGES: gl.constexpr):
        """Refill the ring STAGES - 2 blocks ahead, wait for block kb, encode its weights into weight slot
        wslot and fence them for the tensor cores."""
        _issue_block(x_s, w_s, u_s, sa_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sa_ptrs, sa_mask, kb + STAGES - 2,
                     nblocks, STAGES, GLU)
        async_copy.wait_group(STAGES - 2)
        slot = kb % STAGES
        _encode(w_s, wa_s, slot, wslot, gl.load(sc_ptrs + kb), c_l)
        if GLU:
            _encode(u_s, wu_s, slot, wslot, gl.load(suc_ptrs + kb), c_l)
        fence_async_shared()

    @gluon.jit
    def _mma(x_s, wa_s, wu_s, kb, wslot, p, p_u, GLU: gl.constexpr, STAGES: gl.constexpr):
        """Issue block kb's FP8 MMAs asynchronously into the registers of p / p_u (a promoted block's, whose
        values use_acc=False ignores: no separate zero tile stays live); returns them as tensors in flight."""
        xt = x_s.index(kb % STAGES).permute((1, 0))
        p = warpgroup_mma(wa_s.index(wslot), xt, p, use_acc=False, is_async=True)
        if GLU:
            p_u = warpgroup_mma(wu_s.index(wslot), xt, p_u, use_acc=False, is_async=True)
            p, p_u = warpgroup_mma_wait(num_outstanding=2, deps=[p, p_u])
        else:
            p = warpgroup_mma_wait(num_outstanding=1, deps=[p])
            p_u = p  # (unused without GLU: no second tile carried through the loop)
        return p, p_u

    @gluon.jit
    def _promote(acc, acc_u, p, p_u, sc_ptrs, suc_ptrs, sa_s, sa_ptrs, sa_mask, kb, GLU: gl.constexpr,
                 STAGES: gl.constexpr):
        """acc += p * 2^(bmax - 133)[row] * sa[token]: block kb's sum in fp32 with both scales. GLU: the token
        scales from the block's ring slot (which the next refill of it comes after), since a per-token pointer
        tile in the accumulator's layout (16 per thread) does not fit beside six accumulator tiles; GEMM2 loads
        them through such pointers (the bundled ptxas crashes, signal 11, on its shared-memory variant)."""
        if GLU:
            sa = sa_s.index(kb % STAGES).load(gl.SliceLayout(0, acc.type.layout))
        else:
            sa = gl.load(sa_ptrs + kb, mask=sa_mask, other=0.0)
        sw = ((_bmax(gl.load(sc_ptrs + kb)) - 6) << 23).to(gl.float32, bitcast=True)
        acc = acc + p * sw[:, None] * sa[None, :]
        if GLU:
            sw_u = ((_bmax(gl.load(suc_ptrs + kb)) - 6) << 23).to(gl.float32, bitcast=True)
            acc_u = acc_u + p_u * sw_u[:, None] * sa[None, :]
        else:
            acc_u = acc
        return acc, acc_u

    @gluon.jit
    def _wait(p, p_u, GLU: gl.constexpr):
        """Wait for the MMAs in flight (p / p_u): their block sums, ready to promote."""
        if GLU:
            p, p_u = warpgroup_mma_wait(num_outstanding=0, deps=[p, p_u])
        else:
            p = warpgroup_mma_wait(num_outstanding=0, deps=[p])
            p_u = p
        return p, p_u

    @gluon.jit
    def _wide_fp8_kernel(
        A, AS, W, WS, C, CS, SORTED, EXPERT_IDS, NUM_POST, TOPK_W,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm, stride_csm,
        BM: gl.constexpr, BN: gl.constexpr, GLU: gl.constexpr, NW: gl.constexpr, STAGES: gl.constexpr,
    ):
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 32])
        x_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[NW, 1],
                                             order=[1, 0])
        c_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[16, 2], warps_per_cta=[NW, 1],
                                             order=[1, 0])
        x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        b_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        pid_m = gl.program_id(0)
        pid_n = gl.program_id(1)
        if pid_m * BM >= gl.load(NUM_POST):
            return
        e = gl.load(EXPERT_IDS + pid_m).to(gl.int64)

        # activation codes of the block's rows (GLU: the pairs' tokens; GEMM2: z in sorted order)
        _, xvalid, rows = block_rows(SORTED, pid_m * BM, num_pairs, top_k, BM, gl.SliceLayout(1, x_l), GLU)
        xk = gl.arange(0, 128, layout=gl.SliceLayout(0, x_l))
        x_ptrs = A + rows[:, None] * stride_am + xk[None, :]
        x_mask = xvalid[:, None] & (xk[None, :] < 128)
        # their scales (one per thread; through the ring to the accumulator's token layout)
        v_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[NW], order=[0])
        _, vvalid, vrows = block_rows(SORTED, pid_m * BM, num_pairs, top_k, BM, v_l, GLU)
        sa_ptrs = AS + vrows * stride_asm
        if GLU:  # the ring brings them (`_promote`)
            sd_ptrs = sa_ptrs
            svalid = vvalid
        else:  # GEMM2: rows in sorted order, pointers in the accumulator's token layout
            _, svalid, srows = block_rows(SORTED, pid_m * BM, num_pairs, top_k, BM, gl.SliceLayout(0, acc_l), GLU)
            sd_ptrs = AS + srows * stride_asm

        # packed weight bytes (16 per thread, coalesced) and scale words: per row of the encode layout and of
        # the accumulator layout
        cn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, c_l))
        ck = gl.arange(0, 64, layout=gl.SliceLayout(0, c_l))
        wc_ptrs = W + e * stride_we + cn[:, None].to(gl.int64) * stride_wn + ck[None, :]
        uc_ptrs = wc_ptrs + up_off * stride_wn
        sc_ptrs = WS + e * stride_wse + cn.to(gl.int64) * stride_wsn
        suc_ptrs = sc_ptrs + up_off * stride_wsn
        an = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, acc_l))
        sa_w_ptrs = WS + e * stride_wse + an.to(gl.int64) * stride_wsn
        sa_wu_ptrs = sa_w_ptrs + up_off * stride_wsn

        x_s = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM, 128], x_sl)
        sa_s = gl.allocate_shared_memory(gl.float32, [STAGES, BM], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        w_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, 64], b_sl)
        u_s = w_s
        if GLU:
            u_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, 64], b_sl)
        a_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        wa_s = gl.allocate_shared_memory(gl.float8e4nv, [2, BN, 128], a_sl)
        wu_s = wa_s
        if GLU:
            wu_s = gl.allocate_shared_memory(gl.float8e4nv, [2, BN, 128], a_sl)

        acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        pb = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        acc_u = acc  # (GLU: the up projection's tiles)
        pb_u = pb
        if GLU:
            acc_u = gl.zeros([BN, BM], gl.float32, layout=acc_l)
            pb_u = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        nblocks = K // 128
        for s in gl.static_range(STAGES - 2):
            _issue_block(x_s, w_s, u_s, sa_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sa_ptrs, vvalid, s, nblocks, STAGES,
                         GLU)
        # block 0 into weight slot 0 and its MMAs in flight; then pairs: block 2t + 1 (slot 1) while 2t runs,
        # block 2t + 2 (slot 0) while 2t + 1 runs; a block's sum is promoted while the next one's MMAs run
        _stage(x_s, w_s, u_s, sa_s, wa_s, wu_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sa_ptrs, vvalid, sc_ptrs, suc_ptrs,
               0, nblocks, 0, c_l, GLU, STAGES)
        pa = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        pa_u = pa
        if GLU:
            pa_u = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        pa, pa_u = _mma(x_s, wa_s, wu_s, 0, 0, pa, pa_u, GLU, STAGES)
        for t in range((nblocks + 1) // 2):
            b1 = gl.minimum(2 * t + 1, nblocks - 1)  # (odd counts: the last pair repeats the last block)
            _stage(x_s, w_s, u_s, sa_s, wa_s, wu_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sa_ptrs, vvalid, sc_ptrs,
                   suc_ptrs, b1, nblocks, 1, c_l, GLU, STAGES)
            pa, pa_u = _wait(pa, pa_u, GLU)
            pb, pb_u = _mma(x_s, wa_s, wu_s, b1, 1, pb, pb_u, GLU, STAGES)
            acc, acc_u = _promote(acc, acc_u, pa, pa_u, sa_w_ptrs, sa_wu_ptrs, sa_s, sd_ptrs, svalid, 2 * t,
                                  GLU, STAGES)
            b2 = gl.minimum(2 * t + 2, nblocks - 1)
            _stage(x_s, w_s, u_s, sa_s, wa_s, wu_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sa_ptrs, vvalid, sc_ptrs,
                   suc_ptrs, b2, nblocks, 0, c_l, GLU, STAGES)
            pb, pb_u = _wait(pb, pb_u, GLU)
            pa, pa_u = _mma(x_s, wa_s, wu_s, b2, 0, pa, pa_u, GLU, STAGES)
            if 2 * t + 1 < nblocks:
                acc, acc_u = _promote(acc, acc_u, pb, pb_u, sa_w_ptrs, sa_wu_ptrs, sa_s, sd_ptrs, svalid,
                                       2 * t + 1, GLU, STAGES)
        pa, pa_u = _wait(pa, pa_u, GLU)  # the repeat (or, for even counts, block n - 1 again): not promoted

        # epilogue in the accumulator layout: [BN channels, BM pairs]
        sp = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_l))
        spair = gl.load(SORTED + sp)
        cvalid = spair < num_pairs
        if GLU:
            gate = gl.minimum(acc.to(gl.bfloat16).to(gl.float32), limit)
            up = gl.minimum(gl.maximum(acc_u.to(gl.bfloat16).to(gl.float32), -limit), limit)
            rw = gl.load(TOPK_W + spair, mask=cvalid, other=0.0)
            z = ((gate / (1.0 + gl.exp(-gate)) * up) * rw[None, :]).to(gl.bfloat16).to(gl.float32)
            # W2's input quantisation (act_quant): per pair, over these 128 channels (BN == 128)
            s, inv = _pow2_scale(gl.maximum(gl.max(gl.abs(z), axis=0), 1e-4))
            q = gl.minimum(gl.maximum(z * inv[None, :], -448.0), 448.0).to(gl.float8e4nv)
            gl.store(C + sp.to(gl.int64)[None, :] * stride_cm + an[:, None], q)
            gl.store(CS + sp.to(gl.int64) * stride_csm + pid_n, s)
        else:
            c_ptrs = C + spair.to(gl.int64)[None, :] * stride_cm + an[:, None]
            gl.store(c_ptrs, acc.to(gl.bfloat16), mask=cvalid[None, :] & (an[:, None] >= 0))


def launch(kernel_args: tuple, grid: tuple, bm: int, bn: int, glu: bool, num_warps: int, stages: int):
    """`_wide_fp8_kernel[grid](*kernel_args)` with the layout constants; stages >= 3 ring slots (one block each).
    Returns the compiled kernel."""
    if stages < 3:
        raise ValueError(f"moe_wide_fp8: stages {stages} too few (>= 3)")
    if bn < 16 * num_warps or (glu and bn != 128):
        raise ValueError(f"moe_wide_fp8: bn {bn} (GLU: 128; >= 16 x {num_warps} warps)")
    return _wide_fp8_kernel[grid](*kernel_args, BM=bm, BN=bn, GLU=glu, NW=num_warps, STAGES=stages,
                                  num_warps=num_warps)
