"""`prefill_attention` written out in Gluon: explicit asynchronous wgmmas, so the next key tile's copy and the
tensor cores' work overlap the softmax (Flash: 64 heads, head dim 512, one query per program).

Why (docs/kernels_e2e_notes.md, sessions 30-31): the Triton kernel keeps the whole head dim of every head in one
program (a [64, 512] fp32 accumulator over 8 warps), waits for each wgmma right after issuing it (`tl.dot`), and
its 64-key tiles run ≈ 5 µs each against ≈ 1.1 µs of MMA work. Here, for one query t:

    Q [64 heads, D] in shared memory once; key tiles [64 keys, D] through a 2-slot cp.async ring
    per tile i:  wait for PV(i - 1) -> its slot is free -> tile i + 1's copy issued (tile i's may still land);
                 wait for tile i, QK(i) issued and waited for -> online softmax (fp32 scores, bf16 P stored);
                 PV(i) issued (P from shared memory, V = the key tile: K = V), running while the next tile lands

Both MMAs split their N dimension between the two warpgroups (warps [4, 2]): QK's keys (32 each), PV's head dim
(D / 2 each), so the accumulator is 128 registers per thread. The scores' row maximum crosses the two warpgroups
(the compiler's reduction through shared memory, CTA barriers); the running sums stay per warpgroup's keys and
are added once at the end (s34d -> s34e: CSA 2.37 -> 2.34 ms at 8K). The arithmetic is the Triton kernel's: scores
`q.k * scale` in fp32 (-inf for padding keys and -1 slots, read from a valid row), the running maximum starting at
-1e30, P rounded to bf16 for P.V, the denominator summing the unrounded probabilities plus exp(sink), the output
rounded to bf16 and, with cos / sin, rotated back by -t (`norm_rope(inverse=True)`'s expressions). Only the
fp32 summation orders differ from the Triton kernel's (the wgmmas' instruction shape, the two partial sums).

QNORM: q arrives before its per-head norm + RoPE (`prefill_attention(q_norm=)`); once its copy has landed (the first
tiles' copies still in flight) the program applies `norm_rope`'s UNWEIGHTED expressions to Q in shared memory, half
the heads at a time, saving the [T, H, D] write and read of a separate `norm_rope` launch.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON

BN = 64  # keys per tile (64 KB of bf16 at D = 512; two ring slots + Q + P: 200 KB of shared memory)
STAGES = 2
PREFETCH_IDX = True  # CSA: a list tile's entry indices loaded one tile before its copy is issued
# head dims >= 128: one warpgroup scores, both multiply (prefill_attention_scorer): "lists" where the tiles include an
# entry list (CSA: H200 s39f, Flash 8K, 2.03 -> 1.92 ms; HCA's causal walk 0.76 either way, SWA 0.56 -> 0.58), True
# for every call, False never
ONE_SCORER = "lists"
PROBE_NO_COPY = False  # bench probe only: skip the key tiles' copies (wrong results) to time the compute chain alone


def supports(q: torch.Tensor, dv: int | None, bn: int | None, num_warps: int | None,
             num_stages: int | None) -> bool:
    """Whether `prefill_attention_gluon` takes this call: CUDA, at most 64 heads, a power-of-two head dim of 64..512
    (its half one wgmma's N), the default launch knobs."""
    d = q.shape[-1]
    return (HAS_TRITON and q.is_cuda and q.shape[1] <= 64 and 64 <= d <= 512 and d & (d - 1) == 0
            and dv in (None, d) and bn in (None, BN) and num_warps is None and num_stages is None)


def supports_q_norm(d: int, rope: int) -> bool:
    """Whether the kernel can norm and rotate Q itself (QNORM): the rope dims a power-of-two slice of whole 64-column
    (128-byte swizzle) rows of Q's shared-memory tile."""
    return rope % 64 == 0 and (d - rope) % 64 == 0 and rope & (rope - 1) == 0 and rope <= d


if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    @gluon.jit
    def _mul_rn(x, y):  # dsv4.kernels._triton.mul_rn (Gluon kernels are compiled only, never interpreted)
        return gl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [x, y], dtype=gl.float32, is_pure=True,
                                         pack=1)

    @gluon.jit
    def _rotate_pairs(a, c, cs, sn):
        """dsv4.kernels._triton.rotate_pairs in Gluon (every product rounded: the same bits)."""
        return _mul_rn(a, cs) - _mul_rn(c, sn), _mul_rn(a, sn) + _mul_rn(c, cs)

    @gluon.jit
    def _tile_rows(K, E, IDX, t, i, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it,
                   BN: gl.constexpr, layout: gl.constexpr, CAUSAL_R: gl.constexpr, idx_pre=None):
        """Tile i's key rows in a 1-D layout: (row pointers, valid mask). Tiles below n_win walk the window
        (rows past its end read its last row), the rest the entry list (-1 slots read entry 0; idx_pre: the
        list's slots already loaded by `_list_idx`)."""
        offs = gl.arange(0, BN, layout=layout)
        if i < n_win:
            rows = j_lo + i * BN + offs
            valid = rows < j_hi
            ptrs = K + gl.minimum(rows, j_hi - 1).to(gl.int64) * stride_kt
        else:
            slot = (i - n_win) * BN + offs
            if CAUSAL_R > 0:  # every complete entry, in order
                idx = gl.where(slot < n_list, slot, -1)
            elif idx_pre is None:
                idx = gl.load(IDX + t.to(gl.int64) * stride_it + slot, mask=slot < n_idx, other=-1)
            else:
                idx = idx_pre
            valid = idx >= 0
            ptrs = E + gl.where(valid, idx, 0).to(gl.int64) * stride_et
        return ptrs, valid

    @gluon.jit
    def _query_tiles(t, q_pos0, key_pos0, window, n_idx, BN: gl.constexpr, HAS_E: gl.constexpr,
                     CAUSAL_R: gl.constexpr):
        """Query t's key tiles: (j_lo, j_hi, n_win, n_list, n_tiles) -- its window rows [j_lo, j_hi) in n_win tiles,
        then its n_list entries (HCA's causal walk: every complete one)."""
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
        return j_lo, j_hi, n_win, n_list, n_win + gl.cdiv(n_list, BN)

    @gluon.jit
    def _store_out(o, OUT, COS, SIN, t, H, stride_ot, stride_oh, stride_ct, COL0: gl.constexpr, NOPE: gl.constexpr,
                   ROT: gl.constexpr, NW: gl.constexpr):
        """Columns [COL0, COL0 + width) of query t's output: o (fp32 [64 heads, width], normalised) rounded to bf16
        and, with ROT, rotated back by -t (`norm_rope(inverse=True)`'s expressions; rope pairs from NOPE)."""
        BH: gl.constexpr = o.shape[0]
        NC: gl.constexpr = o.shape[1]
        out_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[NW, 1],
                                               order=[1, 0])
        o = gl.convert_layout(o, out_l)
        if ROT:  # on the bf16 output (pairs 2i, 2i + 1 adjacent in a thread)
            o = o.to(gl.bfloat16).to(gl.float32)
            ev, od = gl.split(gl.reshape(o, [BH, NC // 2, 2]))
            pair = COL0 // 2 + gl.arange(0, NC // 2, layout=gl.SliceLayout(0, ev.type.layout))
            rp = pair >= NOPE // 2
            c = gl.load(COS + t.to(gl.int64) * stride_ct + (pair - NOPE // 2), mask=rp, other=1.0)[None, :]
            sn = -gl.load(SIN + t.to(gl.int64) * stride_ct + (pair - NOPE // 2), mask=rp, other=0.0)[None, :]
            o = gl.convert_layout(gl.reshape(gl.join(*_rotate_pairs(ev, od, c, sn)), [BH, NC]), out_l)
        oh = gl.arange(0, BH, layout=gl.SliceLayout(1, out_l))
        oc = COL0 + gl.arange(0, NC, layout=gl.SliceLayout(0, out_l))
        gl.store(OUT + t.to(gl.int64) * stride_ot + oh[:, None] * stride_oh + oc[None, :], o.to(gl.bfloat16),
                 mask=(oh < H)[:, None] & (oc >= 0)[None, :])

    @gluon.jit
    def _list_idx(IDX, t, i, n_win, n_idx, stride_it, BN: gl.constexpr, layout: gl.constexpr):
        """The entry list's slots of tile i (-1 for a window tile or past the list), for `_tile_rows(idx_pre=)`."""
        slot = (i - n_win) * BN + gl.arange(0, BN, layout=layout)
        return gl.load(IDX + t.to(gl.int64) * stride_it + slot, mask=(slot >= 0) & (slot < n_idx), other=-1)

    @gluon.jit
    def _issue_tile(K, E, IDX, k_s, t, i, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et,
                    stride_it, BN: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, ld_l: gl.constexpr,
                    CAUSAL_R: gl.constexpr, NO_COPY: gl.constexpr = False, idx_pre=None):
        """cp.async of tile i's [BN, D] key rows into ring slot i % STAGES; one commit group (empty past the end)."""
        if i < n_tiles and not NO_COPY:
            ptrs, _ = _tile_rows(K, E, IDX, t, i, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et, stride_it,
                                 BN, gl.SliceLayout(1, ld_l), CAUSAL_R, idx_pre)
            cols = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
            async_copy.async_copy_global_to_shared(k_s.index(i % STAGES), ptrs[:, None] + cols[None, :])
        async_copy.commit_group()

    @gluon.jit
    def _softmax(s, m, l, valid, scale):
        """One online-softmax step over a tile's scores s [64, BN] (fp32, wgmma layout; valid: its keys):
        (running maximum, running sum, the accumulator's rescale factor, bf16 P)."""
        s = gl.where(valid[None, :], s * scale, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, axis=1))
        alpha = gl.exp(m - m_new)
        p = gl.exp(s - m_new[:, None])
        BH: gl.constexpr = s.shape[0]
        BN: gl.constexpr = s.shape[1]
        part = gl.sum(gl.reshape(p, [BH, 2, BN // 2]), axis=2)  # per warpgroup's keys: no exchange
        return m_new, l * gl.convert_layout(alpha, gl.SliceLayout(1, part.type.layout))[:, None] + part, alpha, \
            p.to(gl.bfloat16)

    @gluon.jit
    def _tiles_loop(K, E, IDX, q_s, k_s, p_s, m, l, s_zero, t, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt,
                    stride_et, stride_it, scale, BH: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                    STAGES: gl.constexpr, ld_l: gl.constexpr, s_l: gl.constexpr, o_l: gl.constexpr,
                    CAUSAL_R: gl.constexpr, NO_COPY: gl.constexpr, PRE_IDX: gl.constexpr):
        """The tiles' loop, every slot refilled as soon as its P.V completes and before the wait for the next tile
        (so two tiles' copies are in flight while P.V(i - 1) runs; the prologue issued STAGES tiles). H200 s34e,
        Flash 8K, ms per layer, refilled after the next tile's QK was issued instead: CSA 2.34 -> 2.20, HCA 0.82 ->
        0.78, SWA 0.62 -> 0.56. Returns (acc, m, l)."""
        async_copy.wait_group(STAGES - 1)  # Q and tile 0 landed (this thread's copies)
        fence_async_shared()
        gl.thread_barrier()
        s = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _, valid = _tile_rows(K, E, IDX, t, 0, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et,
                              stride_it, BN, gl.SliceLayout(0, s_l), CAUSAL_R)  # (while QK runs)
        s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
        m, l, alpha, p = _softmax(s, m, l, valid, scale)
        p_s.store(p)
        fence_async_shared()
        gl.thread_barrier()
        acc = gl.zeros([BH, D], gl.float32, layout=o_l)
        acc = warpgroup_mma(p_s, k_s.index(0), acc, use_acc=False, is_async=True)
        PRE: gl.constexpr = PRE_IDX and CAUSAL_R == 0
        if PRE:  # the entry slots of the next tile to copy, a tile ahead (their load's latency off the chain)
            nxt = _list_idx(IDX, t, STAGES, n_win, n_idx, stride_it, BN, gl.SliceLayout(1, ld_l))
        for i in range(1, n_tiles):
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])  # P.V(i - 1) done
            gl.thread_barrier()  # ... in both warpgroups: its slot and P are free
            if PRE:
                _issue_tile(K, E, IDX, k_s, t, i - 1 + STAGES, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt,
                            stride_et, stride_it, BN, D, STAGES, ld_l, CAUSAL_R, NO_COPY, nxt)
                nxt = _list_idx(IDX, t, i + STAGES, n_win, n_idx, stride_it, BN, gl.SliceLayout(1, ld_l))
            else:
                _issue_tile(K, E, IDX, k_s, t, i - 1 + STAGES, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt,
                            stride_et, stride_it, BN, D, STAGES, ld_l, CAUSAL_R, NO_COPY)
            async_copy.wait_group(STAGES - 1)  # tile i landed (the later ones may still be in flight)
            fence_async_shared()
            gl.thread_barrier()
            s = warpgroup_mma(q_s, k_s.index(i % STAGES).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            _, valid = _tile_rows(K, E, IDX, t, i, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et,
                                  stride_it, BN, gl.SliceLayout(0, s_l), CAUSAL_R)  # (while QK runs)
            s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
            m, l, alpha, p = _softmax(s, m, l, valid, scale)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
            p_s.store(p)
            fence_async_shared()
            gl.thread_barrier()
            acc = warpgroup_mma(p_s, k_s.index(i % STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        async_copy.wait_group(0)
        return acc, m, l

    @gluon.jit
    def _bf16(v):
        return v.to(gl.bfloat16).to(gl.float32)

    @gluon.jit
    def _norm_q_in_place(q_s, QCOS, QSIN, t, q_eps, stride_qc, BH: gl.constexpr, D: gl.constexpr,
                         QNOPE: gl.constexpr, NW: gl.constexpr):
        """Q in q_s with each head's unweighted norm (bf16 arithmetic), then the RoPE of dims QNOPE.. (a column
        slice of whole 128-byte swizzle rows): `norm_rope._norm_rope_rows`'s NORM == 2 and ROT expressions, the
        norm half the heads at a time (each thread writes back the elements it read; padding heads stay zeros)."""
        HALF: gl.constexpr = BH // 2
        ROPE: gl.constexpr = D - QNOPE
        ld_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[NW, 1],
                                              order=[1, 0])
        for hh in gl.static_range(2):
            y = q_s.slice(hh * HALF, HALF).load(ld_l).to(gl.float32)
            mean = _bf16(gl.sum(_bf16(y * y), axis=1) / D)
            r = _bf16(gl.rsqrt(_bf16(mean + q_eps)))
            q_s.slice(hh * HALF, HALF).store((y * r[:, None]).to(gl.bfloat16))
        gl.thread_barrier()  # the rope columns of a head were normed by other threads
        rope_s = q_s.slice(QNOPE, ROPE, dim=1)
        a, c = gl.split(gl.reshape(rope_s.load(ld_l).to(gl.float32), [BH, ROPE // 2, 2]))
        pair = gl.arange(0, ROPE // 2, layout=gl.SliceLayout(0, a.type.layout))
        cs = gl.load(QCOS + t.to(gl.int64) * stride_qc + pair)[None, :]
        sn = gl.load(QSIN + t.to(gl.int64) * stride_qc + pair)[None, :]
        y = gl.convert_layout(gl.reshape(gl.join(*_rotate_pairs(a, c, cs, sn)), [BH, ROPE]), ld_l)
        rope_s.store(y.to(gl.bfloat16))

    @gluon.jit
    def _attn_kernel(
        Q, K, E, IDX, SINK, OUT, COS, SIN, QCOS, QSIN,
        H, n_idx, q_pos0, key_pos0, window, scale, q_eps,
        stride_qt, stride_qh, stride_kt, stride_et, stride_it, stride_ot, stride_oh, stride_ct, stride_qc,
        D: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, HAS_E: gl.constexpr, ROT: gl.constexpr,
        NOPE: gl.constexpr, CAUSAL_R: gl.constexpr, QNORM: gl.constexpr, QNOPE: gl.constexpr,
        NO_COPY: gl.constexpr = False, PRE_IDX: gl.constexpr = False,
    ):
        BH: gl.constexpr = 64
        NW: gl.constexpr = gl.num_warps()
        s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                      instr_shape=[16, BN // 2, 16])
        o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                      instr_shape=[16, D // 2, 16])
        ld_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[NW, 1],
                                              order=[1, 0])
        sw: gl.constexpr = 128 if D >= 64 else 2 * D
        kv_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=sw, element_bitwidth=16, rank=2)
        p_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=2 * BN if BN < 64 else 128, element_bitwidth=16,
                                                  rank=2)
        q_s = gl.allocate_shared_memory(gl.bfloat16, [BH, D], kv_sl)
        k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, D], kv_sl)
        p_s = gl.allocate_shared_memory(gl.bfloat16, [BH, BN], p_sl)

        t = gl.program_id(0)
        j_lo, j_hi, n_win, n_list, n_tiles = _query_tiles(t, q_pos0, key_pos0, window, n_idx, BN, HAS_E, CAUSAL_R)

        # Q (padding heads zero-filled), then the first STAGES tiles (every slot); QNORM: Q normed in place once it
        # landed, while the tiles land (the loop's first wait, fence and barrier cover its stores)
        qh = gl.arange(0, BH, layout=gl.SliceLayout(1, ld_l))
        qd = gl.arange(0, D, layout=gl.SliceLayout(0, ld_l))
        async_copy.async_copy_global_to_shared(
            q_s, Q + t.to(gl.int64) * stride_qt + qh[:, None] * stride_qh + qd[None, :],
            mask=(qh < H)[:, None] & (qd >= 0)[None, :])
        async_copy.commit_group()
        for s in gl.static_range(STAGES):
            _issue_tile(K, E, IDX, k_s, t, s, n_tiles, n_win, j_lo, j_hi, n_list, n_idx, stride_kt, stride_et,
                        stride_it, BN, D, STAGES, ld_l, CAUSAL_R, NO_COPY)
        if QNORM:
            async_copy.wait_group(STAGES)  # Q landed (this thread's copies) ...
            gl.thread_barrier()  # ... and every thread's
            _norm_q_in_place(q_s, QCOS, QSIN, t, q_eps, stride_qc, BH, D, QNOPE, NW)

        m = gl.full([BH], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_l))
        s_zero = gl.zeros([BH, BN], gl.float32, layout=s_l)
        l = gl.sum(gl.reshape(s_zero, [BH, 2, BN // 2]), axis=2)  # running sums per warpgroup's keys
        acc, m, l = _tiles_loop(K, E, IDX, q_s, k_s, p_s, m, l, s_zero, t, n_tiles, n_win, j_lo, j_hi, n_list, n_idx,
                                stride_kt, stride_et, stride_it, scale, BH, BN, D, STAGES, ld_l, s_l, o_l, CAUSAL_R,
                                NO_COPY, PRE_IDX)

        offs_h = gl.arange(0, BH, layout=gl.SliceLayout(1, o_l))
        sink = gl.load(SINK + offs_h, mask=offs_h < H, other=0.0)
        row_l: gl.constexpr = gl.SliceLayout(1, o_l)
        denom = gl.convert_layout(gl.sum(l, axis=1), row_l) + gl.exp(sink - gl.convert_layout(m, row_l))
        _store_out(acc / denom[:, None], OUT, COS, SIN, t, H, stride_ot, stride_oh, stride_ct, 0, NOPE, ROT, NW)


def prefill_attention_gluon(q: torch.Tensor, q_pos0: int, keys: torch.Tensor, key_pos0: int, window: int,
                            entries: torch.Tensor | None, entry_idx: torch.Tensor | None, sink: torch.Tensor,
                            scale: float, cos: torch.Tensor | None, sin: torch.Tensor | None, out: torch.Tensor,
                            causal_ratio: int, has_e: bool, q_norm: tuple | None = None):
    """The launch for `prefill_attention` (its inputs already checked, contiguous, sink / cos / sin fp32; `supports`
    holds; q_norm: None or (eps, cos, sin) of q's pending norm + RoPE, fp32 tables). Returns the compiled kernel."""
    from dsv4.kernels import prefill_attention_scorer

    n, h, d = q.shape
    rot = cos is not None
    q_eps, qcos, qsin = q_norm if q_norm is not None else (0.0, sink, sink)  # unread without q_norm
    causal = causal_ratio > 0 and has_e and entry_idx is None
    e = entries if has_e else keys
    idx = entry_idx if has_e and not causal else keys
    cs = (cos, sin) if rot else (sink, sink)  # unread if not rot
    ints = (h, (e.shape[0] if causal else idx.shape[1]) if has_e else 0, q_pos0, key_pos0, window, float(scale),
            float(q_eps))
    strides = (q.stride(0), q.stride(1), keys.stride(0), e.stride(0), idx.stride(0) if has_e and not causal else 0,
               out.stride(0), out.stride(1), cos.stride(0) if rot else 0, qcos.stride(0) if q_norm is not None else 0)
    consts = dict(D=d, HAS_E=has_e, ROT=rot, NOPE=d - 2 * cos.shape[1] if rot else d,
                  CAUSAL_R=causal_ratio if causal else 0, QNORM=q_norm is not None,
                  QNOPE=d - 2 * qcos.shape[1] if q_norm is not None else d)
    if (ONE_SCORER is True or ONE_SCORER == "lists" and has_e and not causal) and prefill_attention_scorer.supports(d):
        return prefill_attention_scorer.prefill_attention_scorer(q, keys, e, idx, sink, out, cs, (qcos, qsin), ints,
                                                                 strides, consts, no_copy=PROBE_NO_COPY)
    return _attn_kernel[(n,)](q, keys, e, idx, sink, out, *cs, qcos, qsin, *ints, *strides, BN=BN, STAGES=STAGES,
                              **consts, NO_COPY=PROBE_NO_COPY, PRE_IDX=PREFETCH_IDX, num_warps=8)
