"""The mHC Triton kernels (the launchers, references and module notes live in dsv4.kernels.mhc).

`_mix_kernel` (fused post, 24 or 4 mixes as split partials; `_mix_rows_kernel` the same for a few tokens on
CUDA cores) and the finishes `_finish_kernel` ("row") and `_finish_split_kernel` ("split").
"""

from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON, pdl_kernel, pdl_wait, prefetch_l2, tl, triton  # noqa: F401

if HAS_TRITON:
    from dsv4.kernels.moe_combine import combine_columns, combine_rows

    @triton.jit
    def _mix_dot(acc, xk, FH, FL, col0, offs_d, HCD, NP: tl.constexpr, INTERP: tl.constexpr, TRANS: tl.constexpr):
        """acc[BT, NP] += xk[BT, BK] (bf16) . fn[:, col0 + offs_d]^T via the hi/lo bf16 split. TRANS: the same
        product transposed with hi and lo stacked, acc[2 NP, BT] += [hi; lo][:, cols] . xk^T (one 64-row
        wgmma; the kernel adds the halves at the end): the fn tile feeds the MMA from shared memory as loaded
        and the stream tile is stored to shared memory once, where the untransposed dot converts the stream
        tile into its register operand layout through shared memory on every step."""
        if TRANS:
            offs_n = tl.arange(0, 2 * NP)
            row = tl.where(offs_n < NP, offs_n, offs_n - NP)
            ptr = tl.where(offs_n < NP, FH, FL)[:, None] + row[:, None] * HCD + col0 + offs_d[None, :]
            w = tl.load(ptr)
            xt = tl.trans(xk)
            if INTERP:
                xt, w = xt.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(w, xt, acc)
        else:
            offs_n = tl.arange(0, NP)
            ptr = offs_n[None, :] * HCD + col0 + offs_d[:, None]
            hi, lo = tl.load(FH + ptr), tl.load(FL + ptr)
            if INTERP:  # Triton's CPU interpreter multiplies bf16 dot operands as raw bits
                xk, hi, lo = xk.to(tl.float32), hi.to(tl.float32), lo.to(tl.float32)
            acc = tl.dot(xk, lo, tl.dot(xk, hi, acc))
        return acc

    @triton.jit
    def _post_stream(pk, f, ck, x0, x1, x2, x3):
        """X'_k = post_k f + sum_j comb[j, k] X_j, ck = (comb[j, k] for j = 0..3): a [BT, BK] tile with [BT, 1]
        columns, or one token's row with scalars."""
        return pk * f + (ck[0] * x0 + ck[1] * x1 + ck[2] * x2 + ck[3] * x3)

    @triton.jit
    def _comb_column(COMB, offs_t, k: tl.constexpr, tmask):
        """(comb[:, j, k] for j = 0..3) as [BT, 1] columns (comb rows of 16 per token)."""
        cb = COMB + offs_t * 16 + k
        return (tl.load(cb + 0, mask=tmask, other=0.0)[:, None], tl.load(cb + 4, mask=tmask, other=0.0)[:, None],
                tl.load(cb + 8, mask=tmask, other=0.0)[:, None], tl.load(cb + 12, mask=tmask, other=0.0)[:, None])

    @triton.jit
    def _comb_columns(COMB, offs_t, tmask):
        """`_comb_column` for k = 0..3."""
        return (_comb_column(COMB, offs_t, 0, tmask), _comb_column(COMB, offs_t, 1, tmask),
                _comb_column(COMB, offs_t, 2, tmask), _comb_column(COMB, offs_t, 3, tmask))

    @pdl_kernel
    @triton.jit
    def _mix_kernel(
        X, F, POST, COMB, XOUT, FH, FL, PART, SQ, T, D, d_per_split,
        FUSE_POST: tl.constexpr, DO_MIX: tl.constexpr, NP: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
        INTERP: tl.constexpr, TRANS: tl.constexpr, COMB_ONCE: tl.constexpr, CY=None, CS=None, CIDS=None, top_k=0,
        num_experts=0, stride_r=0, COMBINE: tl.constexpr = False, C_SHARED: tl.constexpr = False,
        C_RANGES: tl.constexpr = 0,
    ):
        """The mix (docstring of dsv4.kernels.mhc). COMB_ONCE: the fused post's comb columns loaded before the
        column loop (registers) rather than in every step. COMBINE: F summed from a deferred MoE combine's rows, as
        in `_mix_rows_kernel`."""
        pdl_wait()
        pid_t = tl.program_id(0)
        pid_s = tl.program_id(1)
        offs_t = pid_t.to(tl.int64) * BT + tl.arange(0, BT)  # (int64: T * 4 D passes 2^31 past 131K tokens)
        tmask = offs_t < T
        HCD = 4 * D
        row = offs_t[:, None] * HCD
        if FUSE_POST:  # per-token post [4] and comb [4, 4] as columns
            p0 = tl.load(POST + offs_t * 4 + 0, mask=tmask, other=0.0)[:, None]
            p1 = tl.load(POST + offs_t * 4 + 1, mask=tmask, other=0.0)[:, None]
            p2 = tl.load(POST + offs_t * 4 + 2, mask=tmask, other=0.0)[:, None]
            p3 = tl.load(POST + offs_t * 4 + 3, mask=tmask, other=0.0)[:, None]
        if FUSE_POST and COMB_ONCE:
            comb = _comb_columns(COMB, offs_t, tmask)
        if TRANS:
            acc = tl.zeros((2 * NP, BT), dtype=tl.float32)
        else:
            acc = tl.zeros((BT, NP), dtype=tl.float32)
        sq = tl.zeros((BT,), dtype=tl.float32)
        d_lo = pid_s * d_per_split
        for i in range(0, d_per_split, BK):
            offs_d = d_lo + i + tl.arange(0, BK)
            m2 = tmask[:, None] & (offs_d[None, :] < D)
            x0 = tl.load(X + row + 0 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            x1 = tl.load(X + row + 1 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            x2 = tl.load(X + row + 2 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            x3 = tl.load(X + row + 3 * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
            if FUSE_POST:
                if COMBINE:
                    f = combine_rows(CY, CS, CIDS, offs_t, tmask, offs_d, offs_d < D, D, top_k,
                                     num_experts, stride_r, C_SHARED, BT, BK, C_RANGES).to(tl.bfloat16).to(tl.float32)
                else:
                    f = tl.load(F + offs_t[:, None] * D + offs_d[None, :], mask=m2, other=0.0).to(tl.float32)
                if not COMB_ONCE:
                    comb = _comb_columns(COMB, offs_t, tmask)
                y0 = _post_stream(p0, f, comb[0], x0, x1, x2, x3)
                y1 = _post_stream(p1, f, comb[1], x0, x1, x2, x3)
                y2 = _post_stream(p2, f, comb[2], x0, x1, x2, x3)
                y3 = _post_stream(p3, f, comb[3], x0, x1, x2, x3)
                b0, b1, b2, b3 = y0.to(tl.bfloat16), y1.to(tl.bfloat16), y2.to(tl.bfloat16), y3.to(tl.bfloat16)
                orow = XOUT + row + offs_d[None, :]
                tl.store(orow + 0 * D, b0, mask=m2)
                tl.store(orow + 1 * D, b1, mask=m2)
                tl.store(orow + 2 * D, b2, mask=m2)
                tl.store(orow + 3 * D, b3, mask=m2)
            else:
                b0, b1, b2, b3 = x0.to(tl.bfloat16), x1.to(tl.bfloat16), x2.to(tl.bfloat16), x3.to(tl.bfloat16)
            if DO_MIX:
                f0, f1, f2, f3 = b0.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32), b3.to(tl.float32)
                sq += tl.sum(f0 * f0 + f1 * f1 + f2 * f2 + f3 * f3, axis=1)
                acc = _mix_dot(acc, b0, FH, FL, 0 * D, offs_d, HCD, NP, INTERP, TRANS)
                acc = _mix_dot(acc, b1, FH, FL, 1 * D, offs_d, HCD, NP, INTERP, TRANS)
                acc = _mix_dot(acc, b2, FH, FL, 2 * D, offs_d, HCD, NP, INTERP, TRANS)
                acc = _mix_dot(acc, b3, FH, FL, 3 * D, offs_d, HCD, NP, INTERP, TRANS)
        if DO_MIX and TRANS:  # the hi and lo halves' sums added: [NP, BT]
            mix = tl.sum(tl.reshape(acc, (2, NP, BT)), axis=0)
            offs_n = tl.arange(0, NP)
            tl.store(PART + (pid_s * T + offs_t[None, :]) * NP + offs_n[:, None], mix, mask=tmask[None, :])
        elif DO_MIX:
            offs_n = tl.arange(0, NP)
            tl.store(PART + (pid_s * T + offs_t[:, None]) * NP + offs_n[None, :], acc, mask=tmask[:, None])
        if DO_MIX:
            tl.store(SQ + pid_s * T + offs_t, sq, mask=tmask)

    @pdl_kernel
    @triton.jit
    def _mix_rows_kernel(
        X, F, POST, COMB, XOUT, FH, FL, PART, SQ, T, D, d_per_split, HCD,
        FUSE_POST: tl.constexpr, NM: tl.constexpr, NP: tl.constexpr, BK: tl.constexpr, PREFETCH: tl.constexpr,
        FN_EARLY: tl.constexpr = False, CY=None, CS=None, CIDS=None, top_k=0, num_experts=0, stride_r=0,
        COMBINE: tl.constexpr = False, C_SHARED: tl.constexpr = False, C_RANGES: tl.constexpr = 0,
    ):
        """`_mix_kernel` for a few tokens on CUDA cores (no 16-row dot tile for one live row): program s takes
        columns [s d_per_split, +d_per_split) of each stream for every token in turn; the fused post's X' in
        `_post_stream`'s expression; the first NM mixes as fp32 FMAs of the exact bf16 X' with fn's hi and lo
        halves (NM: the mixes the finish reads, padded to a power of two). FN_EARLY (one token, d_per_split == BK:
        one step; `ROWS_FN_EARLY`): the step's fn tiles loaded into registers before the PDL wait (static weights),
        not from L2 after X' is stored. COMBINE (a deferred MoE combine, `moe_combine.PendingCombine`): F is
        summed from the routed rows (+ shared) as the combine would have, rounded to bf16 as its output was.
        (The finish by the last-arriving program instead of its own launch was bit-identical and slower: session 51.)"""
        sid = tl.program_id(0)
        offs_n = tl.arange(0, NM)
        d_lo = sid * d_per_split
        if FN_EARLY:
            offs_e = d_lo + tl.arange(0, BK)
            fn_tiles = _fn_tiles(FH, FL, offs_n, offs_e, offs_e < D, D, HCD)
        elif PREFETCH:  # the static fn rows of this program's columns, into L2 before the wait
            for k in tl.static_range(4):
                prefetch_l2(FH + k * D + d_lo, offs_n.to(tl.int64) * HCD, d_per_split * 2)
                prefetch_l2(FL + k * D + d_lo, offs_n.to(tl.int64) * HCD, d_per_split * 2)
        pdl_wait()
        for t in range(T):
            acc = tl.zeros((NM, BK), dtype=tl.float32)
            sq = tl.zeros((BK,), dtype=tl.float32)
            xrow = X + t * HCD
            for i in range(0, d_per_split, BK):
                offs_d = d_lo + i + tl.arange(0, BK)
                dm = offs_d < D
                x0 = tl.load(xrow + 0 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
                x1 = tl.load(xrow + 1 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
                x2 = tl.load(xrow + 2 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
                x3 = tl.load(xrow + 3 * D + offs_d, mask=dm, other=0.0).to(tl.float32)
                if FUSE_POST:
                    if COMBINE:
                        f = combine_columns(CY, CS, CIDS, tl.cast(t, tl.int64), offs_d, dm, D, top_k, num_experts,
                                            stride_r, C_SHARED, BK, C_RANGES).to(tl.bfloat16).to(tl.float32)
                    else:
                        f = tl.load(F + t * D + offs_d, mask=dm, other=0.0).to(tl.float32)
                    cb = COMB + t * 16
                    y0 = _post_row(tl.load(POST + t * 4 + 0), f, cb, 0, x0, x1, x2, x3)
                    y1 = _post_row(tl.load(POST + t * 4 + 1), f, cb, 1, x0, x1, x2, x3)
                    y2 = _post_row(tl.load(POST + t * 4 + 2), f, cb, 2, x0, x1, x2, x3)
                    y3 = _post_row(tl.load(POST + t * 4 + 3), f, cb, 3, x0, x1, x2, x3)
                    b0, b1, b2, b3 = y0.to(tl.bfloat16), y1.to(tl.bfloat16), y2.to(tl.bfloat16), y3.to(tl.bfloat16)
                    orow = XOUT + t * HCD + offs_d
                    tl.store(orow + 0 * D, b0, mask=dm)
                    tl.store(orow + 1 * D, b1, mask=dm)
                    tl.store(orow + 2 * D, b2, mask=dm)
                    tl.store(orow + 3 * D, b3, mask=dm)
                    x0, x1, x2, x3 = b0.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32), b3.to(tl.float32)
                sq += x0 * x0 + x1 * x1 + x2 * x2 + x3 * x3
                if FN_EARLY:
                    acc = _fma_hilo(acc, x0, fn_tiles[0], fn_tiles[1])
                    acc = _fma_hilo(acc, x1, fn_tiles[2], fn_tiles[3])
                    acc = _fma_hilo(acc, x2, fn_tiles[4], fn_tiles[5])
                    acc = _fma_hilo(acc, x3, fn_tiles[6], fn_tiles[7])
                else:
                    acc = _mix_fma(acc, x0, FH, FL, 0 * D, offs_n, offs_d, dm, HCD)
                    acc = _mix_fma(acc, x1, FH, FL, 1 * D, offs_n, offs_d, dm, HCD)
                    acc = _mix_fma(acc, x2, FH, FL, 2 * D, offs_n, offs_d, dm, HCD)
                    acc = _mix_fma(acc, x3, FH, FL, 3 * D, offs_n, offs_d, dm, HCD)
            tl.store(PART + (sid * T + t) * NP + offs_n, tl.sum(acc, axis=1))
            tl.store(SQ + sid * T + t, tl.sum(sq, axis=0))

    @triton.jit
    def _post_row(pk, f, cb, k: tl.constexpr, x0, x1, x2, x3):
        """`_post_stream` for one token's [BK] columns (comb scalars): the same expression, the same bits."""
        return _post_stream(pk, f, (tl.load(cb + 0 + k), tl.load(cb + 4 + k), tl.load(cb + 8 + k),
                                    tl.load(cb + 12 + k)), x0, x1, x2, x3)

    @triton.jit
    def _fn_tile(FW, col0, offs_n, offs_d, dm, HCD):
        """fn's hi or lo half [NM, BK] at columns col0 + offs_d, bf16 as loaded."""
        return tl.load(FW + offs_n[:, None] * HCD + col0 + offs_d[None, :], mask=dm[None, :], other=0.0)

    @triton.jit
    def _fn_tiles(FH, FL, offs_n, offs_d, dm, D, HCD):
        """(hi, lo) of the four streams' columns offs_d: eight [NM, BK] bf16 tiles."""
        return (_fn_tile(FH, 0 * D, offs_n, offs_d, dm, HCD), _fn_tile(FL, 0 * D, offs_n, offs_d, dm, HCD),
                _fn_tile(FH, 1 * D, offs_n, offs_d, dm, HCD), _fn_tile(FL, 1 * D, offs_n, offs_d, dm, HCD),
                _fn_tile(FH, 2 * D, offs_n, offs_d, dm, HCD), _fn_tile(FL, 2 * D, offs_n, offs_d, dm, HCD),
                _fn_tile(FH, 3 * D, offs_n, offs_d, dm, HCD), _fn_tile(FL, 3 * D, offs_n, offs_d, dm, HCD))

    @triton.jit
    def _fma_hilo(acc, xk, hi, lo):
        """acc[NM, BK] += (hi + lo) * xk as two fp32 FMAs (bf16 x bf16 products are exact)."""
        return tl.fma(lo.to(tl.float32), xk[None, :], tl.fma(hi.to(tl.float32), xk[None, :], acc))

    @triton.jit
    def _mix_fma(acc, xk, FH, FL, col0, offs_n, offs_d, dm, HCD):
        """`_fma_hilo` with the hi / lo tiles loaded here (converted at the load: loaded through `_fn_tile` the same
        math took 128 registers instead of 110, offline)."""
        ptr = offs_n[:, None] * HCD + col0 + offs_d[None, :]
        hi = tl.load(FH + ptr, mask=dm[None, :], other=0.0).to(tl.float32)
        lo = tl.load(FL + ptr, mask=dm[None, :], other=0.0).to(tl.float32)
        return _fma_hilo(acc, xk, hi, lo)

    @triton.jit
    def _sigmoid(v):
        return 1.0 / (1.0 + tl.exp(-v))

    @triton.jit
    def _rho(sq_parts, D, norm_eps):
        """1 / RMS of a token's four streams, from its loaded split partial sums of squares ([SP], 0 past nsplit)."""
        return 1.0 / tl.sqrt(tl.sum(sq_parts, axis=0) / (4 * D) + norm_eps)

    # The Sinkhorn programs (all their loads, then a CTA barrier) and the split finish's collapse programs (the stream
    # columns and base / scale, a CTA barrier, then the partials: ptxas moves no memory operation across a barrier)
    # issue their loads before using any. Left to itself ptxas put loads after the first shuffles of rho (a use of the
    # partials): two or three memory latencies in turn (Nsight, s42d: the 8K row finish at 6.4 cycles of
    # long-scoreboard stall per issued instruction, its top stalls the first uses of each load). Measured (s42e /
    # s42f): 8-layer B = 1 decode replay 1.27 -> 1.24 ms, the 4-layer 8K forward's finish kernels 2,088 -> 1,997 µs;
    # the row finish's collapse keeps its order (the same change there cost a CTA per SM: 96 registers, +2 %).

    @triton.jit
    def _post_comb(PART, SQ, BASE, SCALE, POST, COMB, t, T, D, offs_s, smask, hc_eps, norm_eps,
                   ITERS: tl.constexpr, NP: tl.constexpr):
        """post [4] and the Sinkhorn comb [4, 4] of token t, from the split partials of its mixes 4..23."""
        j4 = tl.arange(0, 4)
        jk = j4[:, None] * 4 + j4[None, :]  # [source j, destination k]
        post_parts = tl.load(PART + (offs_s[:, None] * T + t) * NP + 4 + j4[None, :], mask=smask[:, None], other=0.0)
        comb_parts = tl.load(PART + (offs_s[:, None, None] * T + t) * NP + 8 + jk[None, :, :],
                             mask=smask[:, None, None], other=0.0)
        sq = tl.load(SQ + offs_s * T + t, mask=smask, other=0.0)
        scale1, base_post = tl.load(SCALE + 1), tl.load(BASE + 4 + j4)
        scale2, base_comb = tl.load(SCALE + 2), tl.load(BASE + 8 + jk)
        tl.debug_barrier()  # (every load above issued before the first use)
        rho = _rho(sq, D, norm_eps)
        m_post = tl.sum(post_parts, axis=0) * rho
        post = 2.0 * _sigmoid(m_post * scale1 + base_post)
        tl.store(POST + t * 4 + j4, post)
        m_comb = tl.sum(comb_parts, axis=0) * rho
        a = m_comb * scale2 + base_comb
        e = tl.exp(a - tl.max(a, axis=1)[:, None])
        c = e / tl.sum(e, axis=1)[:, None] + hc_eps
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
        for _ in tl.static_range(ITERS - 1):
            c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
            c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
        tl.store(COMB + t * 16 + jk, c)

    @triton.jit
    def _pre_static(BASE, SCALE):
        """The weights `_pre_weights` reads: (scale_0, base_0..3)."""
        return tl.load(SCALE), tl.load(BASE + tl.arange(0, 4))

    @triton.jit
    def _pre_partials(PART, SQ, t, T, offs_s, smask, NP: tl.constexpr):
        """The partials `_pre_weights` reads for token t: its mixes 0..3 and its sums of squares, per split."""
        j4 = tl.arange(0, 4)
        return (tl.load(PART + (offs_s[:, None] * T + t) * NP + j4[None, :], mask=smask[:, None], other=0.0),
                tl.load(SQ + offs_s * T + t, mask=smask, other=0.0))

    @triton.jit
    def _pre_weights(partials, static, D, hc_eps, norm_eps):
        """pre_j = sigmoid(rho m_j scale_0 + base_j) + eps (also the HC head's w_j), as four scalars, from
        `_pre_partials` and `_pre_static`."""
        parts, sq = partials
        scale0, base = static
        j4 = tl.arange(0, 4)
        m = tl.sum(parts, axis=0) * _rho(sq, D, norm_eps)
        pre = _sigmoid(m * scale0 + base) + hc_eps
        # a masked sum adds exact zeros: each scalar is pre's own value
        return (tl.sum(tl.where(j4 == 0, pre, 0.0), axis=0), tl.sum(tl.where(j4 == 1, pre, 0.0), axis=0),
                tl.sum(tl.where(j4 == 2, pre, 0.0), axis=0), tl.sum(tl.where(j4 == 3, pre, 0.0), axis=0))

    @triton.jit
    def _streams(xrow, D, offs_d, dm):
        """The four streams' bf16 columns offs_d of a token row, as loaded (converted where used)."""
        return (tl.load(xrow + 0 * D + offs_d, mask=dm, other=0.0), tl.load(xrow + 1 * D + offs_d, mask=dm, other=0.0),
                tl.load(xrow + 2 * D + offs_d, mask=dm, other=0.0), tl.load(xrow + 3 * D + offs_d, mask=dm, other=0.0))

    @triton.jit
    def _collapse(xs, p0, p1, p2, p3):
        """u = sum_j pre_j X_j over the loaded columns xs (`_streams`), fp32 -> bf16. An explicit fma chain (not a
        tl.sum over a [4, BD] tile, nor a + b left to LLVM's contraction, both of which follow the layout) so that
        both finish variants round u alike."""
        x0, x1, x2, x3 = xs[0].to(tl.float32), xs[1].to(tl.float32), xs[2].to(tl.float32), xs[3].to(tl.float32)
        return tl.fma(p3, x3, tl.fma(p2, x2, tl.fma(p1, x1, p0 * x0))).to(tl.bfloat16)

    @triton.jit
    def _finish_row(X, PART, SQ, BASE, SCALE, NORM_W, U, NORMED, t, T, D, offs_s, smask, hc_eps, norm_eps,
                    HAS_NORM: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr, ONE_PASS: tl.constexpr):
        """Token t's collapse u (fp32 -> bf16) over its whole row, then optionally the sub-layer RMSNorm over
        the bf16 u (then only the normed row is stored: nothing reads u). ONE_PASS (BD >= D): one chunk holds the
        row, so its loads are all issued at once and the norm takes u from registers; else BD-column chunks, and a
        second pass collapses X again for the norm. (The row's loads issued before the partials', as in the split
        finish, measured 2 % slower here at 8K tokens: 96 registers against 80, one CTA per SM fewer; s42e.)"""
        xrow = X + t * 4 * D
        p0, p1, p2, p3 = _pre_weights(_pre_partials(PART, SQ, t, T, offs_s, smask, NP), _pre_static(BASE, SCALE), D,
                                      hc_eps, norm_eps)
        if ONE_PASS:
            offs_d = tl.arange(0, BD)
            dm = offs_d < D
            u = _collapse(_streams(xrow, D, offs_d, dm), p0, p1, p2, p3)
            if not HAS_NORM:
                tl.store(U + t * D + offs_d, u, mask=dm)
            else:
                uf = u.to(tl.float32)
                r = 1.0 / tl.sqrt(tl.sum(uf * uf, axis=0) / D + norm_eps)
                w = tl.load(NORM_W + offs_d, mask=dm, other=0.0).to(tl.float32)
                tl.store(NORMED + t * D + offs_d, (w * (uf * r)).to(tl.bfloat16), mask=dm)
        else:
            usq = tl.zeros((BD,), dtype=tl.float32)
            for d0 in range(0, D, BD):
                offs_d = d0 + tl.arange(0, BD)
                dm = offs_d < D
                u = _collapse(_streams(xrow, D, offs_d, dm), p0, p1, p2, p3)
                if not HAS_NORM:
                    tl.store(U + t * D + offs_d, u, mask=dm)
                uf = u.to(tl.float32)
                usq += uf * uf
            if HAS_NORM:
                r = 1.0 / tl.sqrt(tl.sum(usq, axis=0) / D + norm_eps)
                for d0 in range(0, D, BD):
                    offs_d = d0 + tl.arange(0, BD)
                    dm = offs_d < D
                    u = _collapse(_streams(xrow, D, offs_d, dm), p0, p1, p2, p3).to(tl.float32)
                    w = tl.load(NORM_W + offs_d, mask=dm, other=0.0).to(tl.float32)
                    tl.store(NORMED + t * D + offs_d, (w * (u * r)).to(tl.bfloat16), mask=dm)

    @pdl_kernel
    @triton.jit
    def _finish_kernel(
        X, PART, SQ, BASE, SCALE, NORM_W, U, NORMED, POST, COMB,
        T, D, nsplit, hc_eps, norm_eps,
        HAS_NORM: tl.constexpr, ITERS: tl.constexpr,
        NP: tl.constexpr, SP: tl.constexpr, BD: tl.constexpr, ONE_PASS: tl.constexpr,
    ):
        """collapse="row": program (t, 0) collapses token t's whole row, program (t, 1) runs post + Sinkhorn."""
        pdl_wait()
        t = tl.program_id(0).to(tl.int64)  # (row offsets past 2^31 elements: see _mix_kernel)
        offs_s = tl.arange(0, SP)
        smask = offs_s < nsplit
        if tl.program_id(1) == 1:
            _post_comb(PART, SQ, BASE, SCALE, POST, COMB, t, T, D, offs_s, smask, hc_eps, norm_eps, ITERS, NP)
        else:
            _finish_row(X, PART, SQ, BASE, SCALE, NORM_W, U, NORMED, t, T, D, offs_s, smask, hc_eps, norm_eps,
                        HAS_NORM, NP, BD, ONE_PASS)

    @pdl_kernel
    @triton.jit
    def _finish_split_kernel(
        X, PART, SQ, BASE, SCALE, NORM_W, U, NORMED, POST, COMB, USQ, CNT,
        T, D, nsplit, hc_eps, norm_eps,
        HAS_NORM: tl.constexpr, LEAD: tl.constexpr, ITERS: tl.constexpr,
        NP: tl.constexpr, SP: tl.constexpr, BD: tl.constexpr, NBP: tl.constexpr, NBD: tl.constexpr,
        NORM_ONE: tl.constexpr = False,
    ):
        """collapse="split", grid (T, LEAD + nb): with LEAD = 1 (mHC pre) program (t, 0) runs post + Sinkhorn;
        program (t, LEAD + c) collapses columns [c BD, (c + 1) BD) of token t; with a norm, the token's last
        chunk program to finish normalises the whole row (NORM_ONE: in one NBD >= D step, its loads issued before
        the partials' sum)."""
        pdl_wait()
        t = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) - LEAD
        nb = tl.num_programs(1) - LEAD
        offs_s = tl.arange(0, SP)
        smask = offs_s < nsplit
        if LEAD == 1:
            if c < 0:
                _post_comb(PART, SQ, BASE, SCALE, POST, COMB, t, T, D, offs_s, smask, hc_eps, norm_eps, ITERS, NP)
        if c >= 0:
            offs_d = c * BD + tl.arange(0, BD)
            dm = offs_d < D
            xs = _streams(X + t * 4 * D, D, offs_d, dm)
            static = _pre_static(BASE, SCALE)
            tl.debug_barrier()  # (the loads above issued before the partials' loads and any use)
            p0, p1, p2, p3 = _pre_weights(_pre_partials(PART, SQ, t, T, offs_s, smask, NP), static, D, hc_eps,
                                          norm_eps)
            u = _collapse(xs, p0, p1, p2, p3)
            tl.store(U + t * D + offs_d, u, mask=dm)
            if HAS_NORM:
                uf = u.to(tl.float32)
                tl.store(USQ + t * NBP + c, tl.sum(uf * uf, axis=0))
                # Publish u and the partial, count the arrival (the ordering of fp8_linear's split K: the CTA
                # barrier orders every thread's stores before the one thread's gpu-scope acq_rel atomic; in the
                # last arriver its acquire, then a second barrier, order the .cg (L2) loads after all releases).
                tl.debug_barrier()
                arrived = tl.atomic_add(CNT + t, 1, sem="acq_rel", scope="gpu")
                if arrived == nb - 1:  # uniform over the CTA: the atomic's result is broadcast
                    tl.debug_barrier()
                    # the nb partials by chunk index, one fixed reduction tree: the same bits whoever is last
                    offs_b = tl.arange(0, NBP)
                    if NORM_ONE:  # the row's u and norm weight first, a barrier, then the partials (`NORM_ONE_MAX`)
                        offs_n = tl.arange(0, NBD)
                        nm = offs_n < D
                        un = tl.load(U + t * D + offs_n, mask=nm, other=0.0, cache_modifier=".cg")
                        w = tl.load(NORM_W + offs_n, mask=nm, other=0.0)
                        tl.debug_barrier()
                    part = tl.load(USQ + t * NBP + offs_b, mask=offs_b < nb, other=0.0, cache_modifier=".cg")
                    r = 1.0 / tl.sqrt(tl.sum(part, axis=0) / D + norm_eps)
                    if NORM_ONE:
                        tl.store(NORMED + t * D + offs_n,
                                 (w.to(tl.float32) * (un.to(tl.float32) * r)).to(tl.bfloat16), mask=nm)
                    else:
                        for d0 in range(0, D, NBD):
                            offs_n = d0 + tl.arange(0, NBD)
                            nm = offs_n < D
                            un = tl.load(U + t * D + offs_n, mask=nm, other=0.0, cache_modifier=".cg").to(tl.float32)
                            w = tl.load(NORM_W + offs_n, mask=nm, other=0.0).to(tl.float32)
                            tl.store(NORMED + t * D + offs_n, (w * (un * r)).to(tl.bfloat16), mask=nm)
                    # every chunk of the token has arrived, nothing else touches its counter in this launch
                    tl.store(CNT + t, 0)
