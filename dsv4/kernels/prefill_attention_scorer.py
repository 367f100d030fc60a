"""`prefill_attention_gluon` with one warpgroup scoring every key tile and both multiplying (`ONE_SCORER`): two
warp-specialized partitions of 4 warps.

Why (docs/kernels_e2e_notes.md, session 39): without its key copies the one-program-per-query kernel still takes
75 % of its CSA time (s39c), so the chain per tile is the cost: QK split between the two warpgroups by keys (each
reads all of Q from shared memory for 32 keys: the MMA waits on shared memory, ≈ 1.5× its tensor time), a row
maximum across the warpgroups (shared memory and CTA barriers), and the copy issue on the same warps. Here

    scorer (the default partition)   per tile: QK over all 64 keys (M = 64 heads, N = 64: Q read once per key
                                     tile, the row maximum inside a warp), the softmax, P and its rescale factor
                                     into shared memory, then P.V on the output's first half;
    multiplier (a 4-warp partition)  the copies (Q's second half of heads, every key tile: its threads' cp.async
                                     arrive on the tile's mbarrier), and P.V on the output's second half.

mbarriers: k_full[s] (slot s's tile landed), k_free[s] (both halves' P.V done with slot s: its next tile may be
copied), p_ready[b] / p_free[b] (P buffer b written / read by the multiplier's P.V), q_ready (both halves of Q
normed), l_ready (the final sums and maximum, for the multiplier's epilogue).

Numerics: the pair kernel's (scores, running maximum, bf16 P, rescale, P.V per tile); the running sum adds each
tile's 64 probabilities at once instead of per warpgroup of 32 keys: fp32 summation order only.
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

BN = 64  # keys per tile: two ring slots (64 KB each at D = 512) + Q + two P buffers: 209 KB of shared memory
WORKER_REGS = 232  # the multiplier's registers (setmaxnreg; the scorer keeps the rest)


def supports(d: int) -> bool:
    """Whether the kernel takes head dim d: each half of the output at least one 128-byte swizzle row, and the
    copies in 128-column pieces."""
    return d >= 128 and d % 128 == 0


if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                   warpgroup_mma_wait)

    from dsv4.kernels.prefill_attention_gluon import (_list_idx, _norm_q_in_place, _query_tiles, _store_out,
                                                       _tile_rows)

    K_FULL, K_FREE, P_READY, P_FREE = gl.constexpr(0), gl.constexpr(2), gl.constexpr(4), gl.constexpr(6)
    Q_READY, L_READY = gl.constexpr(8), gl.constexpr(9)

    @gluon.jit
    def _copy_tile(src, k_s, bars, i, n_tiles, idx, BN: gl.constexpr, D: gl.constexpr, ld_l: gl.constexpr,
                   CAUSAL_R: gl.constexpr, NO_COPY: gl.constexpr):
        """cp.async of tile i's [BN, D] key rows into slot i % 2, 128 columns at a time (each address one row pointer
        plus a constant); k_full[i % 2] completes when every thread's copies have landed. idx: the list slots."""
        K, E, IDX, t, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it = src
        if i < n_tiles:
            if not NO_COPY:
                ptrs, _ = _tile_rows(K, E, IDX, t, i, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et,
                                     stride_it, BN, gl.SliceLayout(1, ld_l), CAUSAL_R, idx)
                cols = gl.arange(0, 128, layout=gl.SliceLayout(0, ld_l))
                for c in gl.static_range(D // 128):
                    async_copy.async_copy_global_to_shared(k_s.index(i % 2).slice(c * 128, 128, dim=1),
                                                           ptrs[:, None] + (c * 128 + cols)[None, :])
            async_copy.mbarrier_arrive(bars.index(K_FULL + i % 2), increment_count=False)
        async_copy.commit_group()

    @gluon.jit
    def _slots(src, i, BN: gl.constexpr, layout: gl.constexpr, CAUSAL_R: gl.constexpr):
        """`_list_idx` where the tiles' rows come from an entry list (HCA's causal walk computes its own)."""
        if CAUSAL_R > 0:
            return gl.full([BN], -1, gl.int32, layout=layout)
        else:
            return _list_idx(src[2], src[3], i, src[4], src[8], src[11], BN, layout)

    @gluon.jit
    def _q_half(io, q_s, bars, D: gl.constexpr, QNORM: gl.constexpr, QNOPE: gl.constexpr, HALF: gl.constexpr,
                PENDING: gl.constexpr):
        """Once this partition's copy of Q's heads [32 * HALF, 32 * HALF + 32) has landed: normed in place (QNORM),
        then arrive on q_ready. PENDING: the commit groups issued after Q's (left in flight)."""
        async_copy.wait_group(PENDING)  # this thread's copies of Q's rows ...
        if QNORM:
            gl.thread_barrier()  # ... every thread's
            Q, QCOS, QSIN, SINK, OUT, COS, SIN, H, t, q_eps, stride_qt, stride_qh, stride_qc, s_ot, s_oh, s_ct = io
            _norm_q_in_place(q_s.slice(HALF * 32, 32), QCOS, QSIN, t, q_eps, stride_qc, 32, D, QNOPE, 4)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bars.index(Q_READY), count=1)

    @gluon.jit
    def _issue_q_half(io, q_s, D: gl.constexpr, HALF: gl.constexpr):
        """cp.async of Q's heads [32 * HALF, 32 * HALF + 32) (padding heads zero-filled); one commit group."""
        Q, QCOS, QSIN, SINK, OUT, COS, SIN, H, t, q_eps, stride_qt, stride_qh, stride_qc, s_ot, s_oh, s_ct = io
        ld_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                              order=[1, 0])
        qh = HALF * 32 + gl.arange(0, 32, layout=gl.SliceLayout(1, ld_l))
        qd = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
        async_copy.async_copy_global_to_shared(
            q_s.slice(HALF * 32, 32), Q + t.to(gl.int64) * stride_qt + qh[:, None] * stride_qh + qd[None, :],
            mask=(qh < H)[:, None] & (qd >= 0)[None, :])
        async_copy.commit_group()

    @gluon.jit
    def _store_half(acc, l, m, io, o_l: gl.constexpr, D: gl.constexpr, ROT: gl.constexpr, NOPE: gl.constexpr,
                    HALF: gl.constexpr):
        """Output columns [HALF * D/2, (HALF + 1) * D/2): acc / (l + exp(sink - m)), as the pair kernel stores."""
        Q, QCOS, QSIN, SINK, OUT, COS, SIN, H, t, q_eps, stride_qt, stride_qh, stride_qc, stride_ot, stride_oh, \
            stride_ct = io
        offs_h = gl.arange(0, 64, layout=gl.SliceLayout(1, o_l))
        sink = gl.load(SINK + offs_h, mask=offs_h < H, other=0.0)
        _store_out(acc / (l + gl.exp(sink - m))[:, None], OUT, COS, SIN, t, H, stride_ot, stride_oh, stride_ct,
                   HALF * (D // 2), NOPE, ROT, 4)

    @gluon.jit
    def _qk(q_s, k_s, bars, src, i, s_zero, s_l: gl.constexpr, BN: gl.constexpr, CAUSAL_R: gl.constexpr,
            B: gl.constexpr):
        """Tile i's QK issued once its copy landed (slot B = i % 2), and its keys' valid mask (computed while the
        QK runs). Returns (s in flight, valid)."""
        K, E, IDX, t, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it = src
        mbarrier.wait(bars.index(K_FULL + B), (i // 2) & 1)
        fence_async_shared()
        s = warpgroup_mma(q_s, k_s.index(B).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _, valid = _tile_rows(K, E, IDX, t, i, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it,
                              BN, gl.SliceLayout(0, s_l), CAUSAL_R)
        return s, valid

    @gluon.jit
    def _softmax_pv(acc, m, l, s, valid, k_s, p_s, a_s, bars, i, scale, o_l: gl.constexpr, D: gl.constexpr,
                    B: gl.constexpr):
        """Tile i's softmax from its scores s, P and alpha handed to the multiplier, then P.V on half 0 issued.
        Returns (acc in flight, m, l)."""
        BH: gl.constexpr = 64
        s = gl.where(valid[None, :], s * scale, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, axis=1))
        alpha = gl.exp(m - m_new)
        p = gl.exp(s - m_new[:, None])
        l = l * alpha + gl.sum(p, axis=1)
        if i >= 2:
            mbarrier.wait(bars.index(P_FREE + B), ((i - 2) // 2) & 1)  # the multiplier's P.V(i - 2) is done
        p_s.index(B).store(p.to(gl.bfloat16))
        a_s.slice(B * BH, BH).store(alpha)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bars.index(P_READY + B), count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(p_s.index(B), k_s.index(B).slice(0, D // 2, dim=1), acc, is_async=True)
        return acc, m_new, l

    @gluon.jit
    def _score_tile(acc, m, l, s_zero, q_s, k_s, p_s, a_s, bars, src, i, scale, s_l: gl.constexpr, o_l: gl.constexpr,
                    BN: gl.constexpr, D: gl.constexpr, CAUSAL_R: gl.constexpr, B: gl.constexpr):
        """The scorer's tile i (ring slot and P buffer B = i % 2): QK, softmax, P and alpha out, P.V on half 0.
        Returns (acc, m, l)."""
        s, valid = _qk(q_s, k_s, bars, src, i, s_zero, s_l, BN, CAUSAL_R, B)
        s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
        acc, m, l = _softmax_pv(acc, m, l, s, valid, k_s, p_s, a_s, bars, i, scale, o_l, D, B)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        gl.thread_barrier()
        mbarrier.arrive(bars.index(K_FREE + B), count=1)
        return acc, m, l

    @gluon.jit
    def _multiply_tile(acc, nxt, k_s, p_s, a_s, bars, src, i, n_tiles, o_l: gl.constexpr, ld_l: gl.constexpr,
                       BN: gl.constexpr, D: gl.constexpr, CAUSAL_R: gl.constexpr, NO_COPY: gl.constexpr,
                       B: gl.constexpr):
        """The multiplier's tile i (slot and buffer B = i % 2): P.V on half 1, then tile i + 2's copy into the slot
        once the scorer's P.V on it is done too (nxt: its list slots, loaded a tile ahead). Returns (acc, nxt)."""
        BH: gl.constexpr = 64
        HD: gl.constexpr = D // 2
        mbarrier.wait(bars.index(P_READY + B), (i // 2) & 1)
        alpha = a_s.slice(B * BH, BH).load(gl.SliceLayout(1, o_l))
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_s.index(B), k_s.index(B).slice(HD, HD, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        gl.thread_barrier()
        mbarrier.arrive(bars.index(P_FREE + B), count=1)
        mbarrier.arrive(bars.index(K_FREE + B), count=1)
        if i + 2 < n_tiles:
            mbarrier.wait(bars.index(K_FREE + B), (i // 2) & 1)
            _copy_tile(src, k_s, bars, i + 2, n_tiles, nxt, BN, D, ld_l, CAUSAL_R, NO_COPY)
            nxt = _slots(src, i + 3, BN, gl.SliceLayout(1, ld_l), CAUSAL_R)
        return acc, nxt

    @gluon.jit
    def _scorer(src, smem, io, n_tiles, scale, D: gl.constexpr, BN: gl.constexpr, ROT: gl.constexpr,
                NOPE: gl.constexpr, CAUSAL_R: gl.constexpr, QNORM: gl.constexpr, QNOPE: gl.constexpr):
        """The default partition: Q's first half of heads, then per tile QK, softmax, P out, P.V on half 0."""
        q_s, k_s, p_s, a_s, bars = smem
        BH: gl.constexpr = 64
        HD: gl.constexpr = D // 2
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
        row_o: gl.constexpr = gl.SliceLayout(1, o_l)
        _issue_q_half(io, q_s, D, 0)
        _q_half(io, q_s, bars, D, QNORM, QNOPE, 0, 0)
        mbarrier.wait(bars.index(Q_READY), 0)  # both halves of Q

        m = gl.full([BH], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_l))
        l = gl.zeros([BH], gl.float32, layout=gl.SliceLayout(1, s_l))
        s_zero = gl.zeros([BH, BN], gl.float32, layout=s_l)
        acc = gl.zeros([BH, HD], gl.float32, layout=o_l)
        for i0 in range(0, n_tiles, 2):  # two tiles per step: ring slot and P buffer constexpr
            acc, m, l = _score_tile(acc, m, l, s_zero, q_s, k_s, p_s, a_s, bars, src, i0, scale, s_l, o_l, BN, D,
                                    CAUSAL_R, 0)
            if i0 + 1 < n_tiles:
                acc, m, l = _score_tile(acc, m, l, s_zero, q_s, k_s, p_s, a_s, bars, src, i0 + 1, scale, s_l, o_l,
                                        BN, D, CAUSAL_R, 1)

        a_s.slice(2 * BH, BH).store(l)  # the final sums and maximum, for the multiplier's epilogue
        a_s.slice(3 * BH, BH).store(m)
        gl.thread_barrier()
        mbarrier.arrive(bars.index(L_READY), count=1)
        _store_half(acc, gl.convert_layout(l, row_o), gl.convert_layout(m, row_o), io, o_l, D, ROT, NOPE, 0)

    @gluon.jit
    def _multiplier(src, smem, io, n_tiles, D: gl.constexpr, BN: gl.constexpr, ROT: gl.constexpr,
                    NOPE: gl.constexpr, CAUSAL_R: gl.constexpr, QNORM: gl.constexpr, QNOPE: gl.constexpr,
                    NO_COPY: gl.constexpr):
        """The worker partition: Q's second half of heads and every key tile's copy, P.V on half 1."""
        q_s, k_s, p_s, a_s, bars = smem
        BH: gl.constexpr = 64
        HD: gl.constexpr = D // 2
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
        ld_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                              order=[1, 0])
        row_o: gl.constexpr = gl.SliceLayout(1, o_l)
        idx_l: gl.constexpr = gl.SliceLayout(1, ld_l)
        _issue_q_half(io, q_s, D, 1)
        for i in gl.static_range(2):
            _copy_tile(src, k_s, bars, i, n_tiles, _slots(src, i, BN, idx_l, CAUSAL_R),
                       BN, D, ld_l, CAUSAL_R, NO_COPY)
        nxt = _slots(src, 2, BN, idx_l, CAUSAL_R)  # the next copy's list slots, a tile ahead
        _q_half(io, q_s, bars, D, QNORM, QNOPE, 1, 2)

        acc = gl.zeros([BH, HD], gl.float32, layout=o_l)
        for i0 in range(0, n_tiles, 2):
            acc, nxt = _multiply_tile(acc, nxt, k_s, p_s, a_s, bars, src, i0, n_tiles, o_l, ld_l, BN, D, CAUSAL_R,
                                      NO_COPY, 0)
            if i0 + 1 < n_tiles:
                acc, nxt = _multiply_tile(acc, nxt, k_s, p_s, a_s, bars, src, i0 + 1, n_tiles, o_l, ld_l, BN, D,
                                          CAUSAL_R, NO_COPY, 1)
        async_copy.wait_group(0)

        mbarrier.wait(bars.index(L_READY), 0)
        l = a_s.slice(2 * BH, BH).load(row_o)
        m = a_s.slice(3 * BH, BH).load(row_o)
        _store_half(acc, l, m, io, o_l, D, ROT, NOPE, 1)

    @gluon.jit
    def _scorer_kernel(
        Q, K, E, IDX, SINK, OUT, COS, SIN, QCOS, QSIN,
        H, n_idx, q_pos0, key_pos0, window, scale, q_eps,
        stride_qt, stride_qh, stride_kt, stride_et, stride_it, stride_ot, stride_oh, stride_ct, stride_qc,
        D: gl.constexpr, BN: gl.constexpr, HAS_E: gl.constexpr, ROT: gl.constexpr, NOPE: gl.constexpr,
        CAUSAL_R: gl.constexpr, QNORM: gl.constexpr, QNOPE: gl.constexpr, WORKER_REGS: gl.constexpr,
        NO_COPY: gl.constexpr = False,
    ):
        BH: gl.constexpr = 64
        kv_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_s = gl.allocate_shared_memory(gl.bfloat16, [BH, D], kv_sl)
        k_s = gl.allocate_shared_memory(gl.bfloat16, [2, BN, D], kv_sl)
        p_s = gl.allocate_shared_memory(gl.bfloat16, [2, BH, BN], kv_sl)
        # alpha per P buffer, then the final sums and maximum
        a_s = gl.allocate_shared_memory(gl.float32, [4 * BH], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        bars = gl.allocate_shared_memory(gl.int64, [10, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(2):
            mbarrier.init(bars.index(K_FULL + b), count=128)  # the multiplier's threads' cp.async arrivals
            mbarrier.init(bars.index(K_FREE + b), count=2)
            mbarrier.init(bars.index(P_READY + b), count=1)
            mbarrier.init(bars.index(P_FREE + b), count=1)
        mbarrier.init(bars.index(Q_READY), count=2)
        mbarrier.init(bars.index(L_READY), count=1)

        t = gl.program_id(0)
        j_lo, j_hi, n_win, n_list, n_tiles = _query_tiles(t, q_pos0, key_pos0, window, n_idx, BN, HAS_E, CAUSAL_R)
        src = (K, E, IDX, t, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it)  # the key tiles
        smem = (q_s, k_s, p_s, a_s, bars)
        io = (Q, QCOS, QSIN, SINK, OUT, COS, SIN, H, t, q_eps, stride_qt, stride_qh, stride_qc, stride_ot, stride_oh,
              stride_ct)  # Q in, the output out
        gl.warp_specialize([(_scorer, (src, smem, io, n_tiles, scale, D, BN, ROT, NOPE, CAUSAL_R, QNORM, QNOPE)),
                            (_multiplier, (src, smem, io, n_tiles, D, BN, ROT, NOPE, CAUSAL_R, QNORM, QNOPE, NO_COPY))],
                           [4], [WORKER_REGS])


def prefill_attention_scorer(q, keys, e, idx, sink, out, cs, qn, ints, strides, consts, no_copy=False):
    """The launch, from `prefill_attention_gluon.prefill_attention_gluon`'s prepared arguments (`supports(d)` holds):
    cs = (cos, sin), qn = (q_cos, q_sin), ints = (H, n_idx, q_pos0, key_pos0, window, scale, q_eps), strides its 9
    strides, consts its constexprs less STAGES. Returns the compiled kernel."""
    return _scorer_kernel[(q.shape[0],)](q, keys, e, idx, sink, out, *cs, *qn, *ints, *strides, BN=BN,
                                         WORKER_REGS=WORKER_REGS, **consts, NO_COPY=no_copy,
                                         num_warps=4)
