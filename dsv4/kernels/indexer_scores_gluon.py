"""The CSA indexer's prefill scores (`indexer_scores.prefill_index_scores`) in Gluon: the tensor-core dot of head h + 1
runs while head h's scores are rounded, relu'd and weighted (`indexer_scores.PREFILL_GLUON_MIN_KEYS`).

Why (session 68): with the rounding one packed conversion per pair, the Triton kernel runs at ≈ 73 % of the bf16
MMA peak after a long prefix (H100, 64 x 128 tiles, two programs per SM). Triton waits for every wgmma right after
issuing it (the SASS shows `WARPGROUP.DEPBAR.LE gsb0, 0x0` after each head's dot, also when the dot is written one
head ahead), so a program's tensor cores idle during its elementwise work, and each program reads a head's q tile
from L2 for only 128 keys. Here one program (8 warps) takes 64 queries x 256 keys:

    keys [256, D] in shared memory once; q of head h [64, D] through a STAGES-slot cp.async ring, STAGES - 2 heads
    ahead; per head h: wait for its copy, one CTA barrier (every warpgroup is past head h - 2's dot, so its slot may
    be refilled: head h + STAGES - 2's copy is issued), QK(h) issued, QK(h - 1) waited for (the only one in flight
    beside QK(h)), then relu(bf16(QK(h - 1))) * w[:, h - 1] added to the fp32 total while QK(h) runs. The heads go in
    groups of GROUP = 8, the last of each group added after its QK alone (nothing in flight across the loop's back
    edge: ptxas serialised every wgmma otherwise).

Each warpgroup takes half the keys (warps [4, 2], 128 keys each): two [64, 128] fp32 accumulators in flight and the
total, 192 registers of data per thread. The numerics are the Triton kernel's: the same wgmma shape per head (fp32,
exact products), the same bf16 rounding, the head sum in fp32 in head order, -inf from the query's visible count on
(the GPU test asks for equal scores).

Measured (session 68, H100, 8K queries, `bench/sweep_index_scores.py`): 528-563 TFLOP/s against the Triton kernel's
504-575; faster only from 64K keys (a 248K-token prefix: 1.08x, 128K keys 1.04x; 16K / 32K keys 0.98x / 0.95x), so
`indexer_scores.PREFILL_GLUON_MIN_KEYS` routes only such rows here. Both stay near 70 % of the bf16 MMA peak measured in
the same calls (786 TFLOP/s), so the elementwise work was not the whole gap; a kernel without the per-head reset of the
accumulator (K is only 128 per head) is not possible: each head's dot is rounded to bf16 before the head sum.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON

BT, BN, STAGES, WARPS, GROUP = 64, 256, 4, 8, 8


def supports(q: torch.Tensor, keys: torch.Tensor) -> bool:
    """Head dim 128 (the indexer's in Flash and Pro), heads a multiple of GROUP and 16-byte aligned rows."""
    vec = 16 // q.element_size()  # (elements per 16 bytes: bf16 or folded e4m3 operands)
    return (q.shape[-1] == 128 and q.shape[1] % GROUP == 0 and q.stride(0) % vec == 0 and q.stride(1) % vec == 0
            and keys.stride(0) % vec == 0 and q.data_ptr() % 16 == 0 and keys.data_ptr() % 16 == 0)


if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from dsv4.kernels.indexer_scores import RELU_BF16X2_ASM

    @gluon.jit
    def _relu_bf16(x):
        """max(bf16(x), 0) in fp32, a pair per packed conversion (the Triton kernel's instructions)."""
        return gl.inline_asm_elementwise(RELU_BF16X2_ASM, "=r,=r,r,r", [x], dtype=gl.float32, is_pure=True, pack=2)

    @gluon.jit
    def _issue_q(Q, q_s, t0, T, H, h, stride_qt, stride_qh, BT: gl.constexpr, D: gl.constexpr,
                 STAGES: gl.constexpr, ld_l: gl.constexpr):
        """cp.async of head h's q rows [t0, t0 + BT) into slot h % STAGES (rows past T zero-filled); one commit group,
        empty past the last head."""
        if h < H:
            rows = t0 + gl.arange(0, BT, layout=gl.SliceLayout(1, ld_l))
            cols = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
            async_copy.async_copy_global_to_shared(
                q_s.index(h % STAGES), Q + rows.to(gl.int64)[:, None] * stride_qt + h * stride_qh + cols[None, :],
                mask=(rows < T)[:, None] & (cols >= 0)[None, :])
        async_copy.commit_group()

    @gluon.jit
    def _issue(Q, q_s, k_s, t0, T, H, h, free, stride_qt, stride_qh, BT: gl.constexpr, D: gl.constexpr,
               STAGES: gl.constexpr, ld_l: gl.constexpr):
        """QK(h) issued into `free`'s registers once head h's q landed; head h + STAGES - 2's copy issued first, into
        the slot of head h - 2, whose QK every warpgroup has waited for before the barrier."""
        async_copy.wait_group(STAGES - 3)  # head h landed ...
        fence_async_shared()
        gl.thread_barrier()  # ... for every thread
        _issue_q(Q, q_s, t0, T, H, h + STAGES - 2, stride_qt, stride_qh, BT, D, STAGES, ld_l)
        return warpgroup_mma(q_s.index(h % STAGES), k_s.permute((1, 0)), free, use_acc=False, is_async=True)

    @gluon.jit
    def _add_head(running, total, w_ptrs, h, stride_wh, rows, T, OUTSTANDING: gl.constexpr):
        """QK(h) (`running`) waited for, OUTSTANDING later ones left in flight -> (its registers, the total plus
        relu(bf16(QK(h))) * w[:, h])."""
        w = gl.load(w_ptrs + h * stride_wh, mask=rows < T, other=0.0).to(gl.float32)
        done = warpgroup_mma_wait(num_outstanding=OUTSTANDING, deps=[running])
        return done, total + _relu_bf16(done) * w[:, None]

    @gluon.jit
    def _scores_kernel(Q, W, K, VIS, OUT, T, N, H, stride_qt, stride_qh, stride_wt, stride_wh, stride_kn, stride_ot,
                       D: gl.constexpr, BT: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                       GROUP: gl.constexpr, EBITS: gl.constexpr, SK=None, OK=None, GUARD: gl.constexpr = 0):
        """EBITS 16: bf16 operands; 8: folded e4m3 ones (`indexer_fp8`; the total times SK per key). GUARD as the
        Triton kernel's: 1 runs only if OK[0] != 0, 2 only if it is 0."""
        if GUARD != 0:
            if (gl.load(OK) != 0) != (GUARD == 1):
                return
        NW: gl.constexpr = gl.num_warps()
        PF: gl.constexpr = STAGES - 2  # heads copied ahead
        VEC: gl.constexpr = 128 // EBITS  # 16-byte copies
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                      instr_shape=[16, BN // 2, 256 // EBITS])
        ld_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, VEC], threads_per_warp=[32 * VEC // D, D // VEC],
                                              warps_per_cta=[NW, 1], order=[1, 0])
        out_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32],
                                               warps_per_cta=[NW, 1], order=[1, 0])
        sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=EBITS, rank=2)
        t0 = gl.program_id(0) * BT
        n0 = gl.program_id(1) * BN
        rows_o = t0 + gl.arange(0, BT, layout=gl.SliceLayout(1, out_l))
        cols_o = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, out_l))
        out_ptrs = OUT + rows_o.to(gl.int64)[:, None] * stride_ot + cols_o[None, :]
        out_mask = (rows_o < T)[:, None] & (cols_o < N)[None, :]
        vis_o = gl.load(VIS + rows_o, mask=rows_o < T, other=0)
        if n0 >= gl.max(vis_o, axis=0):  # no query of the block sees a key of the tile
            gl.store(out_ptrs, gl.full([BT, BN], float("-inf"), gl.bfloat16, layout=out_l), mask=out_mask)
        else:
            q_s = gl.allocate_shared_memory(Q.dtype.element_ty, [STAGES, BT, D], sl)
            k_s = gl.allocate_shared_memory(K.dtype.element_ty, [BN, D], sl)
            kr = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, ld_l))
            kc = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
            async_copy.async_copy_global_to_shared(k_s, K + kr.to(gl.int64)[:, None] * stride_kn + kc[None, :],
                                                   mask=(kr < N)[:, None] & (kc >= 0)[None, :])
            async_copy.commit_group()
            for h in gl.static_range(PF):  # (the loop's copies keep PF heads ahead)
                _issue_q(Q, q_s, t0, T, H, h, stride_qt, stride_qh, BT, D, STAGES, ld_l)
            rows = t0 + gl.arange(0, BT, layout=gl.SliceLayout(1, s_l))
            w_ptrs = W + rows * stride_wt
            total = gl.zeros([BT, BN], gl.float32, layout=s_l)
            free = gl.zeros([BT, BN], gl.float32, layout=s_l)  # two register sets for the QKs: one in flight, one
            spare = gl.zeros([BT, BN], gl.float32, layout=s_l)  # being added to the total
            # GROUP heads per iteration, unrolled, none in flight across the loop's back edge (an accumulator in
            # flight there made ptxas serialise every wgmma, C7514): GROUP - 1 of GROUP elementwise passes overlap
            for g in range(0, H, GROUP):
                running = _issue(Q, q_s, k_s, t0, T, H, g, free, stride_qt, stride_qh, BT, D, STAGES, ld_l)
                for j in gl.static_range(1, GROUP):
                    nxt = _issue(Q, q_s, k_s, t0, T, H, g + j, spare, stride_qt, stride_qh, BT, D, STAGES, ld_l)
                    spare, total = _add_head(running, total, w_ptrs, g + j - 1, stride_wh, rows, T, 1)
                    running = nxt
                free, total = _add_head(running, total, w_ptrs, g + GROUP - 1, stride_wh, rows, T, 0)
            async_copy.wait_group(0)  # (the empty groups past the last head)
            total = gl.convert_layout(total, out_l)
            if SK is not None:  # (a power of two per key: the unfolded total's bits)
                total = total * gl.load(SK + cols_o, mask=cols_o < N, other=1.0)[None, :]
            total = gl.where(cols_o[None, :] < vis_o[:, None], total, float("-inf"))
            gl.store(out_ptrs, total.to(gl.bfloat16), mask=out_mask)


def prefill_index_scores_gluon(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor,
                               out: torch.Tensor, sk: torch.Tensor | None = None, ok: torch.Tensor | None = None,
                               guard: int = 0) -> torch.Tensor:
    """The launch for `prefill_index_scores` (inputs checked there, `supports` holds) into out [T, N] bf16: bf16
    operands, or folded e4m3 ones with sk (`indexer_fp8`); guard / ok as `_scores_kernel`'s."""
    t, h, d = q.shape
    n = keys.shape[0]
    _scores_kernel[(-(-t // BT), -(-n // BN))](
        q, weights, keys, visible, out, t, n, h, q.stride(0), q.stride(1), weights.stride(0), weights.stride(1),
        keys.stride(0), out.stride(0), D=d, BT=BT, BN=BN, STAGES=STAGES, GROUP=GROUP, EBITS=8 * q.element_size(),
        SK=sk, OK=ok, GUARD=guard, num_warps=WARPS)
    return out
