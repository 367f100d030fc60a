"""`prefill_attention_gluon` with its two warpgroups on alternate key tiles ("seesaw", after FlashMLA's schedule):
one warpgroup's softmax runs while the other's MMAs use the tensor cores.

Why (docs/kernels_e2e_notes.md, session 39): the one-program-per-query kernel splits every tile's scores between
its two warpgroups, so each tile is QK -> a row maximum across both warpgroups (shared memory, CTA barriers) ->
softmax -> P.V, one after the other: Nsight (s39a, CSA 8K) shows 34 % tensor pipe, barrier stalls first, the L2 at
20 % of its peak. Here warpgroup w (a warp-specialized partition of 4 warps) owns

    the key tiles j = w, w + 2, ...: their copies (ring slot w), QK (all of D, M = 64 heads, N = 64 keys: the row
    maximum stays inside a warp) and softmax, P_j and its running maximum m_j into shared memory (buffer w);
    the output columns [w * D/2, (w + 1) * D/2): O_w += P_j V_j[:, half w] for every tile j, its own and the other's.

Per own tile j: P.V of the other's tile j - 1 (its P and m_{j-1} from shared memory, O_w rescaled to m_{j-1}) is
issued first, then QK_j; m_j = max(m_{j-1}, row max) chains the maximum through the tiles in order, as the
one-warpgroup-pair kernel's running maximum does. mbarriers carry the hand-offs: p_ready[w] (P_j written),
p_free[w] (the other's P.V with P_j done: the buffer can take P_{j+2}), k_free[w] (the other's P.V on slot w done:
tile j + 2's copy may start). Each warpgroup sums its own tiles' unrounded probabilities; the two sums are added
at the end, then exp(sink - m) as before.

Numerics against `prefill_attention_gluon`: the same scores, running maximum and bf16 P per tile; O is rescaled in
two steps per tile (to m_{j-1}, then m_j) and the denominator is summed per warpgroup of tiles instead of per
warpgroup of keys: fp32 rounding order only.
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

BN = 64  # keys per tile: two ring slots (64 KB each at D = 512) + Q + two P buffers: 209 KB of shared memory
WORKER_REGS = 240  # the second warpgroup's registers (setmaxnreg)


def supports(d: int) -> bool:
    """Whether the seesaw kernel takes head dim d: each half one whole 128-byte swizzle row or more."""
    return d >= 128


if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                   warpgroup_mma_wait)

    from dsv4.kernels.prefill_attention_gluon import _norm_q_in_place, _tile_rows

    # mbarriers: per warpgroup w, then the two one-shot ones
    P_READY, P_FREE, K_FREE = gl.constexpr(0), gl.constexpr(2), gl.constexpr(4)
    Q_READY, L_READY = gl.constexpr(6), gl.constexpr(7)

    @gluon.jit
    def _issue_own_tile(K, E, IDX, k_s, t, i, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et,
                        stride_it, BN: gl.constexpr, D: gl.constexpr, ld_l: gl.constexpr, CAUSAL_R: gl.constexpr,
                        NO_COPY: gl.constexpr = False):
        """`_issue_tile` into slot i % 2, 128 columns at a time: each copy's address one row pointer plus a
        constant (a whole-row copy's 32 column offsets per thread spilled on 4 warps)."""
        if i < n_tiles and not NO_COPY:
            ptrs, _ = _tile_rows(K, E, IDX, t, i, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it,
                                 BN, gl.SliceLayout(1, ld_l), CAUSAL_R)
            cols = gl.arange(0, 128, layout=gl.SliceLayout(0, ld_l))
            for c in gl.static_range(D // 128):
                async_copy.async_copy_global_to_shared(k_s.index(i % 2).slice(c * 128, 128, dim=1),
                                                       ptrs[:, None] + (c * 128 + cols)[None, :])
        async_copy.commit_group()

    @gluon.jit
    def _own_tile(acc, m_o, m_l, l, s_zero, q_s, k_s, p_s, m_s, bars, src, j, k, n_tiles, scale, s_l: gl.constexpr,
                  o_l: gl.constexpr, ld_l: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, CAUSAL_R: gl.constexpr,
                  WG: gl.constexpr, NO_COPY: gl.constexpr):
        """This warpgroup's tile j (its k-th, in ring slot WG): QK, the softmax from the chained maximum m_o, P_j and
        m_j handed to the other warpgroup, O_w += P_j V_j[:, half w], then tile j + 2's copy once the other half's
        P.V has freed the slot. Returns (acc, m_o, m_l, l)."""
        K, E, IDX, t, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it = src
        BH: gl.constexpr = 64
        HD: gl.constexpr = D // 2
        async_copy.wait_group(0)  # tile j landed (this thread's copies) ...
        fence_async_shared()
        gl.thread_barrier()  # ... every thread's
        s = warpgroup_mma(q_s, k_s.index(WG).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _, valid = _tile_rows(K, E, IDX, t, j, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it,
                              BN, gl.SliceLayout(0, s_l), CAUSAL_R)  # (while QK runs)
        s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
        s = gl.where(valid[None, :], s * scale, float("-inf"))
        m_new = gl.maximum(m_o, gl.max(s, axis=1))
        p = gl.exp(s - m_new[:, None])
        l = l * gl.exp(m_l - m_new) + gl.sum(p, axis=1)
        if k > 0:
            mbarrier.wait(bars.index(P_FREE + WG), (k - 1) & 1)  # the other's P.V with P_{j-2} done
        p_s.index(WG).store(p.to(gl.bfloat16))
        m_s.slice(WG * BH, BH).store(m_new)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bars.index(P_READY + WG), count=1)
        acc = acc * gl.convert_layout(gl.exp(m_o - m_new), gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(p_s.index(WG), k_s.index(WG).slice(WG * HD, HD, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        if j + 2 < n_tiles:  # slot WG takes tile j + 2 once the other half's P.V on it is done
            mbarrier.wait(bars.index(K_FREE + WG), k & 1)
            _issue_own_tile(K, E, IDX, k_s, t, j + 2, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt,
                            stride_et, stride_it, BN, D, ld_l, CAUSAL_R, NO_COPY)
        return acc, m_new, m_new, l

    @gluon.jit
    def _pv_other(acc, m_o, p_s, k_s, m_s, bars, j, row_s: gl.constexpr, o_l: gl.constexpr, HD: gl.constexpr,
                  WG: gl.constexpr):
        """Issue O_w += P_{j-1} V_{j-1}[:, half w] for the other warpgroup's tile j - 1 (O_w rescaled from m_o to
        its m_{j-1} first). Returns (acc, m_{j-1}); the wgmma is left in flight."""
        mbarrier.wait(bars.index(P_READY + 1 - WG), ((j - 1) // 2) & 1)
        m_new = m_s.slice((1 - WG) * 64, 64).load(row_s)
        acc = acc * gl.convert_layout(gl.exp(m_o - m_new), gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(p_s.index(1 - WG), k_s.index(1 - WG).slice(WG * HD, HD, dim=1), acc, is_async=True)
        return acc, m_new

    @gluon.jit
    def _warpgroup(args, D: gl.constexpr, BN: gl.constexpr, ROT: gl.constexpr, NOPE: gl.constexpr,
                   CAUSAL_R: gl.constexpr, QNORM: gl.constexpr, QNOPE: gl.constexpr, NO_COPY: gl.constexpr,
                   WG: gl.constexpr):
        """One warpgroup's part of query t (module docstring): its 32 heads of Q, its tiles, its output columns."""
        (Q, K, E, IDX, SINK, OUT, COS, SIN, QCOS, QSIN, q_s, k_s, p_s, m_s, l_s, bars,
         H, t, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, scale, q_eps,
         stride_qt, stride_qh, stride_kt, stride_et, stride_it, stride_ot, stride_oh, stride_ct, stride_qc) = args
        BH: gl.constexpr = 64
        HD: gl.constexpr = D // 2
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HD, 16])
        ld_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                              order=[1, 0])
        row_s: gl.constexpr = gl.SliceLayout(1, s_l)

        # this warpgroup's half of Q's heads (padding heads zero-filled), then its first tile; Q normed in place
        qh = WG * (BH // 2) + gl.arange(0, BH // 2, layout=gl.SliceLayout(1, ld_l))
        qd = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
        async_copy.async_copy_global_to_shared(
            q_s.slice(WG * (BH // 2), BH // 2), Q + t.to(gl.int64) * stride_qt + qh[:, None] * stride_qh + qd[None, :],
            mask=(qh < H)[:, None] & (qd >= 0)[None, :])
        async_copy.commit_group()
        _issue_own_tile(K, E, IDX, k_s, t, WG, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et,
                        stride_it, BN, D, ld_l, CAUSAL_R, NO_COPY)
        async_copy.wait_group(1)  # Q's rows (this thread's copies)
        if QNORM:
            gl.thread_barrier()
            _norm_q_in_place(q_s.slice(WG * (BH // 2), BH // 2), QCOS, QSIN, t, q_eps, stride_qc, BH // 2, D, QNOPE,
                             4)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(bars.index(Q_READY), count=1)
        mbarrier.wait(bars.index(Q_READY), 0)  # both halves of Q

        m_o = gl.full([BH], -1.0e30, gl.float32, layout=row_s)  # the scale of acc: the last tile's maximum
        m_l = gl.full([BH], -1.0e30, gl.float32, layout=row_s)  # the scale of l: this warpgroup's last tile's
        l = gl.zeros([BH], gl.float32, layout=row_s)
        s_zero = gl.zeros([BH, BN], gl.float32, layout=s_l)
        acc = gl.zeros([BH, HD], gl.float32, layout=o_l)
        src = (K, E, IDX, t, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it)
        if WG == 0:  # tile 0 has no previous tile's P.V
            acc, m_o, m_l, l = _own_tile(acc, m_o, m_l, l, s_zero, q_s, k_s, p_s, m_s, bars, src, 0, 0, n_tiles, scale,
                                         s_l, o_l, ld_l, BN, D, CAUSAL_R, WG, NO_COPY)
        for k in range(1 - WG, (n_tiles + 1 - WG) // 2):
            j = 2 * k + WG
            # the other warpgroup's tile j - 1 on this half first: its slot is free once this P.V is done, and
            # that warpgroup's next copy waits for it
            acc, m_o = _pv_other(acc, m_o, p_s, k_s, m_s, bars, j, row_s, o_l, HD, WG)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            gl.thread_barrier()
            mbarrier.arrive(bars.index(K_FREE + 1 - WG), count=1)
            mbarrier.arrive(bars.index(P_FREE + 1 - WG), count=1)
            acc, m_o, m_l, l = _own_tile(acc, m_o, m_l, l, s_zero, q_s, k_s, p_s, m_s, bars, src, j, k, n_tiles, scale,
                                         s_l, o_l, ld_l, BN, D, CAUSAL_R, WG, NO_COPY)
        if (n_tiles - 1) % 2 != WG:  # the last tile is the other warpgroup's
            acc, m_o = _pv_other(acc, m_o, p_s, k_s, m_s, bars, n_tiles, row_s, o_l, HD, WG)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        async_copy.wait_group(0)

        # the denominator: both warpgroups' sums at the final maximum, plus the sink
        l_s.slice(WG * BH, BH).store(l * gl.exp(m_l - m_o))
        gl.thread_barrier()
        mbarrier.arrive(bars.index(L_READY), count=1)
        mbarrier.wait(bars.index(L_READY), 0)
        row_o: gl.constexpr = gl.SliceLayout(1, o_l)
        offs_h = gl.arange(0, BH, layout=row_o)
        sink = gl.load(SINK + offs_h, mask=offs_h < H, other=0.0)
        m_fin = gl.convert_layout(m_o, row_o)
        denom = (gl.convert_layout(l_s.slice(0, BH).load(row_s) + l_s.slice(BH, BH).load(row_s), row_o)
                 + gl.exp(sink - m_fin))
        o = acc / denom[:, None]
        out_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                               order=[1, 0])
        o = gl.convert_layout(o, out_l)
        if ROT:  # the inverse RoPE on the bf16 output (pairs 2i, 2i + 1 adjacent in a thread; rope pairs from NOPE)
            o = o.to(gl.bfloat16).to(gl.float32)
            ev, od = gl.split(gl.reshape(o, [BH, HD // 2, 2]))
            pair = WG * (HD // 2) + gl.arange(0, HD // 2, layout=gl.SliceLayout(0, ev.type.layout))
            rp = pair >= NOPE // 2
            c = gl.load(COS + t.to(gl.int64) * stride_ct + (pair - NOPE // 2), mask=rp, other=1.0)[None, :]
            sn = -gl.load(SIN + t.to(gl.int64) * stride_ct + (pair - NOPE // 2), mask=rp, other=0.0)[None, :]
            o = gl.convert_layout(gl.reshape(gl.join(ev * c - od * sn, ev * sn + od * c), [BH, HD]), out_l)
        oh = gl.arange(0, BH, layout=gl.SliceLayout(1, out_l))
        od_ = WG * HD + gl.arange(0, HD, layout=gl.SliceLayout(0, out_l))
        gl.store(OUT + t.to(gl.int64) * stride_ot + oh[:, None] * stride_oh + od_[None, :], o.to(gl.bfloat16),
                 mask=(oh < H)[:, None] & (od_ >= 0)[None, :])

    @gluon.jit
    def _seesaw_kernel(
        Q, K, E, IDX, SINK, OUT, COS, SIN, QCOS, QSIN,
        H, n_idx, q_pos0, key_pos0, window, scale, q_eps,
        stride_qt, stride_qh, stride_kt, stride_et, stride_it, stride_ot, stride_oh, stride_ct, stride_qc,
        D: gl.constexpr, BN: gl.constexpr, HAS_E: gl.constexpr, ROT: gl.constexpr, NOPE: gl.constexpr,
        CAUSAL_R: gl.constexpr, QNORM: gl.constexpr, QNOPE: gl.constexpr, WORKER_REGS: gl.constexpr,
        NO_COPY: gl.constexpr = False,
    ):
        BH: gl.constexpr = 64
        kv_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        p_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        v_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        q_s = gl.allocate_shared_memory(gl.bfloat16, [BH, D], kv_sl)
        k_s = gl.allocate_shared_memory(gl.bfloat16, [2, BN, D], kv_sl)
        p_s = gl.allocate_shared_memory(gl.bfloat16, [2, BH, BN], p_sl)
        m_s = gl.allocate_shared_memory(gl.float32, [2 * BH], v_sl)  # m_j per warpgroup
        l_s = gl.allocate_shared_memory(gl.float32, [2 * BH], v_sl)
        bars = gl.allocate_shared_memory(gl.int64, [8, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(6):
            mbarrier.init(bars.index(b), count=1)
        mbarrier.init(bars.index(Q_READY), count=2)
        mbarrier.init(bars.index(L_READY), count=2)

        t = gl.program_id(0)
        pos = q_pos0 + t
        j_lo = gl.maximum(pos - window + 1 - key_pos0, 0)
        j_hi = pos - key_pos0 + 1  # exclusive: the query's own key is the last one
        n_win = gl.cdiv(j_hi - j_lo, BN)
        n_list = 0
        if HAS_E:
            if CAUSAL_R > 0:
                n_list = gl.minimum((pos + 1) // CAUSAL_R, n_idx)
            else:
                n_list = n_idx
        n_tiles = n_win + gl.cdiv(n_list, BN)
        args = (Q, K, E, IDX, SINK, OUT, COS, SIN, QCOS, QSIN, q_s, k_s, p_s, m_s, l_s, bars,
                H, t, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, scale, q_eps,
                stride_qt, stride_qh, stride_kt, stride_et, stride_it, stride_ot, stride_oh, stride_ct, stride_qc)
        gl.warp_specialize([(_warpgroup, (args, D, BN, ROT, NOPE, CAUSAL_R, QNORM, QNOPE, NO_COPY, 0)),
                            (_warpgroup, (args, D, BN, ROT, NOPE, CAUSAL_R, QNORM, QNOPE, NO_COPY, 1))],
                           [4], [WORKER_REGS])


def prefill_attention_seesaw(q, keys, e, idx, sink, out, cs, qn, ints, strides, consts):
    """The launch, from `prefill_attention_gluon.prefill_attention_gluon`'s prepared arguments (`supports(d)` holds):
    cs = (cos, sin), qn = (q_cos, q_sin), ints = (H, n_idx, q_pos0, key_pos0, window, scale, q_eps), strides its 9
    strides, consts its constexprs less STAGES. Returns the compiled kernel."""
    from dsv4.kernels.prefill_attention_gluon import PROBE_NO_COPY

    return _seesaw_kernel[(q.shape[0],)](q, keys, e, idx, sink, out, *cs, *qn, *ints, *strides, BN=BN,
                                         WORKER_REGS=WORKER_REGS, **consts, NO_COPY=PROBE_NO_COPY, num_warps=4)
