"""Lightning-indexer decode scores (spec §2.8) straight from the paged indexer-key pool, one launch,
beside a torch reference of the same signature.

Row b (one query token) scores the entry slots n = 0 .. N-1 of its block table, slot n stored at
`pool[page[b, n], off[b, n]]` and counted only where `present[b, n]` (dsv4.engine.paged_decode
derives these once per step):

  s[b, h, n] = bf16(q[b, h] . K[b, n])            fp32 dot, exact bf16 products
  I[b, n]    = bf16(sum_h fp32(relu(s)) * fp32(w[b, h]))     -inf where not present

which is `Indexer._scores_padded` on `pool.read(page, off, bf16)`. `prefill_index_scores` is the same
math for a prompt chunk's queries against one sequence's contiguous keys, causal by entry count. The pool is a
`paged_state._EntryPool`: with FP8 caches the keys are MXFP4 (`q` int8 [pages, ps, di/2], low
nibble = even element; `s` uint8 E8M0 [pages, ps, di/32]), otherwise plain bf16 `data`
[pages, ps, di]. e2m1 * 2^k is exact in bf16, so the in-register dequantisation equals `read`.

Kernel: grid (B, ceil(N/BN)); a program loads q [Hi, di] and w [Hi] once, gathers BN keys (absent
slots are not read), one tensor-core dot [Hi, BN] and the head reduction. The fp32 sums (di in the
dot, Hi in the reduction) run in another order than torch's, so scores agree except for rare
1-ulp bf16 rounding flips. Device ops only: CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, arrival_counters, tl, triton  # noqa: F401
from dsv4.kernels._triton import pdl_kernel, pdl_wait
from dsv4.kernels.topk import block_for

# `indexer_pick`'s top-k chunk (keys per pass step): the whole kernel's registers follow the largest (offline sm_90a,
# bench/sass_stats.py indexer_scores_topk: 4096 -> 255, 1024 -> 96, 512 -> 62 = the scores alone)
PICK_BLOCK = 512
# The scores' relu(bf16(s)) as one packed conversion per pair (`_relu_bf16`); off: the per-element F2F (the A/B of
# `bench/sweep_index_scores.py`: 1.36-1.53x on the prefill scores after 56K-512K tokens of prefix, session 68, H100)
PACKED_RELU = True
# The prefill scores' launch: (queries, keys) per tile, warps, stages; the sweep's winner after 56K and 248K tokens of
# prefix with the packed conversion (`bench/sweep_index_scores.py`, session 68, H100: 1.10-1.17x 128 x 128 x 8 x 3).
PREFILL_SHAPE = (64, 128, 4, 3)
# The prefill scores through the Gluon kernel (dsv4.kernels.indexer_scores_gluon: the next head's MMA in flight during a
# head's elementwise work) from this many keys on, where it applies and no launch shape is asked for (session 68, H100,
# 8K queries, time of the Triton kernel / the Gluon one: 16K keys 0.98x, 32K 0.95x, 64K 1.08x, 128K 1.04x)
PREFILL_GLUON_MIN_KEYS = 1 << 16
# FP4-simulated operands (`prefill_index_scores(fp4=True)`, the model's default numerics) folded to e4m3 for FP8 dots
# from PREFILL_FP8_MIN_KEYS keys on (`indexer_fp8`: the same scores; Hopper's FP8 MMA summed 3 x 8192^2 such dots
# exactly, `bench/check_fp8_index_dots.py`), through the Triton kernel (its FP8 launch was ahead of the Gluon one's at
# every size; PREFILL_FP8_GLUON: the Gluon one from PREFILL_GLUON_MIN_KEYS keys). Session 73 (H100,
# `bench/sweep_index_scores.py --fp4`, 8K queries, the fold included, µs bf16 -> FP8, every score equal): 2,048 keys
# 284 -> 283, 4,096 698 -> 572 (1.22x), 8,192 1,616 -> 1,198 (1.35x), 16,384 3,437 -> 2,413 (1.42x), 65,536 14,888
# (Gluon 14,524) -> 10,106 (1.47x).
PREFILL_FP8 = True
PREFILL_FP8_MIN_KEYS = 1 << 12
PREFILL_FP8_GLUON = False


# --------------------------------------------------------------------------- torch reference

def indexer_scores_ref(q: torch.Tensor, weights: torch.Tensor, pool, page: torch.Tensor, off: torch.Tensor,
                       present: torch.Tensor) -> torch.Tensor:
    """q [B, Hi, di], weights [B, Hi], pool an `_EntryPool` of indexer keys, page/off/present [B, N]
    -> scores [B, N] in q.dtype (the math of `Indexer._scores_padded`)."""
    return _scores(q, weights, pool.read(page, off, q.dtype), present)


def prefill_index_scores_ref(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                             visible: torch.Tensor) -> torch.Tensor:
    """q [T, Hi, di], weights [T, Hi], one sequence's keys [N, di], visible [T] (query t sees entries
    0 .. visible[t]-1) -> scores [T, N] in q.dtype, -inf where not visible (the scores of
    `Indexer.select_indices`)."""
    present = torch.arange(keys.shape[0], device=keys.device)[None, :] < visible[:, None]
    return _scores(q, weights, keys.expand(q.shape[0], -1, -1), present)


def _scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """keys [B, N, di]: the math of `Indexer._scores_padded`."""
    acc = torch.float32 if q.dtype in (torch.bfloat16, torch.float16) else q.dtype
    s = torch.relu(torch.einsum("bhd,bnd->bhn", q.to(acc), keys.to(acc)).to(q.dtype))
    s = (s.to(acc) * weights.to(acc).unsqueeze(-1)).sum(dim=1).to(q.dtype)
    return s.masked_fill(~present, float("-inf"))


# --------------------------------------------------------------------------- Triton kernel

if HAS_TRITON:
    from dsv4.kernels.topk import topk_row

    @triton.jit
    def _round_bf16(x, INTERP: tl.constexpr):
        """fp32 -> its nearest-even bf16 value, kept in fp32 (the interpreter's cast truncates)."""
        if INTERP:
            bits = x.to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
            return bits.to(tl.float32, bitcast=True)
        return x.to(tl.bfloat16).to(tl.float32)

    # relu(x rounded to bf16) for a pair of fp32 in one packed conversion (F2FP; `.to(tl.bfloat16)` compiles to one
    # quarter-rate F2F per element, the prefill scores' bottleneck beside the MMAs), widened back by shift / mask
    RELU_BF16X2_ASM = tl.constexpr("{ .reg .b32 t; cvt.rn.relu.bf16x2.f32 t, $3, $2; shl.b32 $0, t, 16; "
                                "and.b32 $1, t, 0xFFFF0000; }")

    @triton.jit
    def _relu_bf16(x, INTERP: tl.constexpr, PACKED: tl.constexpr = True):
        """max(bf16(x), 0) kept in fp32."""
        if INTERP or not PACKED:
            return tl.maximum(_round_bf16(x, INTERP), 0.0)
        return tl.inline_asm_elementwise(RELU_BF16X2_ASM, "=r,=r,r,r", [x], dtype=tl.float32, is_pure=True, pack=2)

    @triton.jit
    def _mxfp4_keys(PQ, PS, row_q, row_s, load, D: tl.constexpr):
        """Dequantised MXFP4 keys [BN, D] fp32, built per 32-group as [BN, D/32, 16] bytes (16-byte loads, one
        scale byte per group) whose low / high nibbles are elements 2i / 2i + 1 of the group."""
        g = tl.arange(0, D // 32)[None, :, None]
        i = tl.arange(0, 16)[None, None, :]
        ld = load[:, None, None]
        byte = tl.load(PQ + row_q[:, None, None] + g * 16 + i, mask=ld, other=0).to(tl.int32)
        sb = tl.load(PS + row_s[:, None, None] + g, mask=ld, other=127).to(tl.int32)  # [BN, D/32, 1]
        sbits = tl.where(sb == 0, 1 << 22, tl.where(sb == 255, 0x7FC00000, sb << 23))  # as e8m0_to_float
        scale = sbits.to(tl.float32, bitcast=True)
        lo = _e2m1_value(byte & 0xF) * scale
        hi = _e2m1_value((byte >> 4) & 0xF) * scale
        return tl.reshape(tl.join(lo, hi), (row_q.shape[0], D))

    @triton.jit
    def _e2m1_value(code):
        """fp32 value of e2m1 codes (int32 0..15): 0, 0.5, then 2^(e-1) * (1 + mantissa/2) for magnitudes >= 2."""
        m = code & 7
        normal = (((m >> 1) + 126) << 23 | (m & 1) << 22).to(tl.float32, bitcast=True)
        mag = tl.where(m >= 2, normal, m.to(tl.float32) * 0.5)
        return tl.where(code >= 8, -mag, mag)

    @pdl_kernel
    @triton.jit
    def _scores_kernel(Q, W, PQ, PS, PAGE, OFF, PRESENT, OUT, N, H,
                       sq_b, sq_h, sw_b, sw_h, pq_page, pq_off, ps_page, ps_off,
                       spg_b, spg_n, sof_b, sof_n, spr_b, spr_n, so_b,
                       HP: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, FP4: tl.constexpr,
                       INTERP: tl.constexpr, CNT=None, PICKED=None, VALID=None, k_top=0, so_k=0, sv_k=0,
                       TOPK: tl.constexpr = False, KBLOCK: tl.constexpr = 256, MARK_ABSENT: tl.constexpr = False,
                       PACKED: tl.constexpr = True):
        """TOPK (`indexer_pick`): row b's last-arriving program also picks its top k_top (`topk.topk_row`)."""
        pdl_wait()
        b = tl.program_id(0)
        n = tl.program_id(1) * BN + tl.arange(0, BN)
        h = tl.arange(0, HP)
        d = tl.arange(0, D)
        hm = h < H
        q = tl.load(Q + b * sq_b + h[:, None] * sq_h + d[None, :], mask=hm[:, None], other=0.0)
        w = tl.load(W + b * sw_b + h * sw_h, mask=hm, other=0.0).to(tl.float32)
        inb = n < N
        load = tl.load(PRESENT + b * spr_b + n * spr_n, mask=inb, other=0) != 0  # absent slots: not read
        page = tl.load(PAGE + b * spg_b + n * spg_n, mask=load, other=0).to(tl.int64)
        off = tl.load(OFF + b * sof_b + n * sof_n, mask=load, other=0).to(tl.int64)
        if FP4:
            k = _mxfp4_keys(PQ, PS, page * pq_page + off * pq_off, page * ps_page + off * ps_off, load, D)
        else:
            k = tl.load(PQ + (page * pq_page + off * pq_off)[:, None] + d[None, :], mask=load[:, None],
                        other=0.0).to(tl.float32)
        if INTERP:  # the interpreter multiplies raw bf16 bits in `dot`; fp32 products are exact too
            s = tl.dot(q.to(tl.float32), tl.trans(k))
        else:  # bf16 operands (k is exact in bf16), exact products, fp32 accumulation
            s = tl.dot(q, tl.trans(k.to(tl.bfloat16)))
        s = _relu_bf16(s, INTERP, PACKED)
        total = _round_bf16(tl.sum(s * w[:, None], axis=0), INTERP)
        total = tl.where(load, total, float("-inf"))
        tl.store(OUT + b * so_b + n, total.to(tl.bfloat16), mask=inb)
        if TOPK:  # the CTA barrier puts every thread's score stores before the gpu-scope atomic (`split_k_sum`)
            tl.debug_barrier()
            if tl.atomic_add(CNT + b, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
                tl.debug_barrier()  # (after the acquire: the row's scores from every program are visible)
                tl.store(CNT + b, 0)  # (left zeroed for the next launch / replay: `arrival_counters`)
                topk_row(b.to(tl.int64), OUT, PRESENT, PICKED, VALID, N, k_top, so_b, 1, spr_b, spr_n, so_k, sv_k,
                         True, 0x7F80, True, KBLOCK, MARK_ABSENT)  # (bf16 keys: +inf's bits)


    @triton.jit
    def _prefill_scores_kernel(Q, W, K, VIS, OUT, T, N, H, sq_t, sq_h, sw_t, sw_h, sk_n, so_t,
                               D: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, INTERP: tl.constexpr,
                               PACKED: tl.constexpr = True, SK=None, OK=None, GUARD: tl.constexpr = 0):
        """Scores [BT queries, BN keys]: per head one tensor-core dot, its bf16 rounding, relu and the
        head weight, summed over heads in fp32; -inf from query t's visible count on. Tiles no query of
        the block sees are only filled with -inf (about half of a prompt's tiles). Folded e4m3 operands
        (`indexer_fp8`: W holds w 2^a_q, SK [N] 2^a_k) take FP8 dots and the total times SK; GUARD 1 runs only
        if OK[0] != 0 (the operands folded), GUARD 2 only if it is 0 (the bf16 launch behind it)."""
        if GUARD != 0:
            if (tl.load(OK) != 0) != (GUARD == 1):
                return
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        n = tl.program_id(1) * BN + tl.arange(0, BN)
        d = tl.arange(0, D)
        tm, nm = t < T, n < N
        vis = tl.load(VIS + t, mask=tm, other=0)
        out_ptrs = OUT + t.to(tl.int64)[:, None] * so_t + n[None, :]
        if tl.program_id(1) * BN >= tl.max(vis, axis=0):
            tl.store(out_ptrs, tl.full((BT, BN), float("-inf"), tl.float32).to(tl.bfloat16),
                     mask=tm[:, None] & nm[None, :])
            return
        k = tl.load(K + n.to(tl.int64)[:, None] * sk_n + d[None, :], mask=nm[:, None], other=0.0)
        total = tl.zeros((BT, BN), dtype=tl.float32)
        q_ptrs = Q + t.to(tl.int64)[:, None] * sq_t + d[None, :]
        for h in range(H):
            q = tl.load(q_ptrs + h * sq_h, mask=tm[:, None], other=0.0)
            w = tl.load(W + t * sw_t + h * sw_h, mask=tm, other=0.0).to(tl.float32)
            if INTERP:  # see _scores_kernel
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
            else:
                s = tl.dot(q, tl.trans(k))
            total += _relu_bf16(s, INTERP, PACKED) * w[:, None]
        if SK is not None:  # (a power of two per key: the same bits as the unfolded total's)
            total = total * tl.load(SK + n, mask=nm, other=1.0)[None, :]
        total = tl.where(n[None, :] < vis[:, None], _round_bf16(total, INTERP), float("-inf"))
        tl.store(out_ptrs, total.to(tl.bfloat16), mask=tm[:, None] & nm[None, :])


# --------------------------------------------------------------------------- launcher

def indexer_pick(q: torch.Tensor, weights: torch.Tensor, pool, page: torch.Tensor, off: torch.Tensor,
                 present: torch.Tensor, k: int, mark_absent: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`topk.topk_lowest_index(indexer_scores(...), k, present, mark_absent)` in one launch: each row's
    last-arriving scores program picks the row's top k (the decode indexer's `pick_from_pool` with
    indexer.TOPK_IN_SCORES) -> (picked int64 [B, k] ascending, valid bool [B, k])."""
    bsz, n = page.shape
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"indexer_pick: k must be an int with 1 <= k <= N={n}, got {k!r}")
    picked = torch.empty(bsz, k, dtype=torch.int64, device=q.device)
    valid = torch.empty(bsz, k, dtype=torch.bool, device=q.device)
    indexer_scores(q, weights, pool, page, off, present,
                   pick=dict(CNT=arrival_counters("indexer pick", q.device, bsz), PICKED=picked,
                             VALID=valid.view(torch.uint8), k_top=k, so_k=picked.stride(0), sv_k=valid.stride(0),
                             TOPK=True, KBLOCK=min(PICK_BLOCK, block_for(n)), MARK_ABSENT=mark_absent))
    return picked, valid


def indexer_scores(q: torch.Tensor, weights: torch.Tensor, pool, page: torch.Tensor, off: torch.Tensor,
                   present: torch.Tensor, block_n: int = 64, pick: dict | None = None) -> torch.Tensor:
    """Triton `indexer_scores_ref` (bf16 q; MXFP4 or plain bf16 pools): bf16 [B, N] (pick: `indexer_pick`'s
    kernel arguments)."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.indexer_scores: triton is not installed (use indexer_scores_ref)")
    if q.dim() != 3 or q.dtype != torch.bfloat16:
        raise ValueError(f"indexer_scores: q must be bf16 [B, Hi, di], got {q.dtype} {tuple(q.shape)}")
    bsz, h, di = q.shape
    if di < 32 or di & (di - 1):
        raise ValueError(f"indexer_scores: head dim {di} must be a power of two >= 32")
    if weights.shape != (bsz, h) or not weights.is_floating_point():
        raise ValueError(f"indexer_scores: weights must be float [B={bsz}, Hi={h}], got {weights.dtype} "
                         f"{tuple(weights.shape)}")
    if page.dim() != 2 or page.shape[0] != bsz or off.shape != page.shape or present.shape != page.shape:
        raise ValueError(f"indexer_scores: page/off/present must be [B={bsz}, N], got {tuple(page.shape)}/"
                         f"{tuple(off.shape)}/{tuple(present.shape)}")
    if page.dtype not in (torch.int32, torch.int64) or off.dtype not in (torch.int32, torch.int64) \
            or present.dtype != torch.bool:
        raise ValueError(f"indexer_scores: page/off must be int32/int64 and present bool, got "
                         f"{page.dtype}/{off.dtype}/{present.dtype}")
    if pool.fp4:
        pq, ps = pool.q, pool.s
        if pq.dtype != torch.int8 or ps.dtype != torch.uint8 or pq.shape[-1] * 2 != di or ps.shape[-1] * 32 != di:
            raise ValueError(f"indexer_scores: MXFP4 pool q {pq.dtype} {tuple(pq.shape)} / s {ps.dtype} "
                             f"{tuple(ps.shape)} does not hold {di}-d keys")
    elif not pool.fp8 and pool.data.dtype == torch.bfloat16 and pool.data.shape[-1] == di:
        pq = ps = pool.data
    else:
        raise ValueError("indexer_scores: the pool must store MXFP4 or bf16 keys of the query's head dim")
    if pq.stride(-1) != 1 or ps.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("indexer_scores: q's and the pool's last dims must be contiguous")
    n = page.shape[1]
    out = torch.empty(bsz, n, dtype=torch.bfloat16, device=q.device)
    if bsz == 0 or n == 0:
        return out
    pres = present.view(torch.uint8)  # same bytes; a bool pointer would load as int1
    bn = max(16, min(block_n, triton.next_power_of_2(n)))
    _scores_kernel[(bsz, triton.cdiv(n, bn))](
        q, weights, pq, ps, page, off, pres, out, n, h,
        q.stride(0), q.stride(1), weights.stride(0), weights.stride(1), pq.stride(0), pq.stride(1),
        ps.stride(0), ps.stride(1),
        page.stride(0), page.stride(1), off.stride(0), off.stride(1), pres.stride(0), pres.stride(1),
        out.stride(0),
        HP=max(16, triton.next_power_of_2(h)), D=di, BN=bn, FP4=pool.fp4, INTERP=INTERPRET, PACKED=PACKED_RELU,
        num_warps=4, **(pick or {}))
    return out


def prefill_index_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor,
                         block_t: int | None = None, block_n: int | None = None, warps: int | None = None,
                         stages: int | None = None, fp4: bool = False) -> torch.Tensor:
    """Triton `prefill_index_scores_ref` (bf16 q and keys): bf16 [T, N]; the launch shape's parts left None are
    PREFILL_SHAPE's (none given and at least PREFILL_GLUON_MIN_KEYS keys: the Gluon kernel where it applies).
    fp4: q and keys are FP4-simulated (spec 2.6.2), so with PREFILL_FP8 on, from PREFILL_FP8_MIN_KEYS keys, they are
    folded to e4m3 (`indexer_fp8`) for FP8 dots (the Triton kernel unless PREFILL_FP8_GLUON) -- the same scores,
    with the bf16 kernel queued behind for rows that do not fold."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.indexer_scores: triton is not installed (use prefill_index_scores_ref)")
    if q.dim() != 3 or q.dtype != torch.bfloat16 or q.stride(-1) != 1:
        raise ValueError(f"prefill_index_scores: q must be bf16 [T, Hi, di] (last dim contiguous), got {q.dtype} "
                         f"{tuple(q.shape)}")
    t, h, di = q.shape
    if di < 32 or di & (di - 1):
        raise ValueError(f"prefill_index_scores: head dim {di} must be a power of two >= 32")
    if keys.dim() != 2 or keys.shape[1] != di or keys.dtype != torch.bfloat16 or keys.stride(-1) != 1:
        raise ValueError(f"prefill_index_scores: keys must be bf16 [N, {di}] (last dim contiguous), got "
                         f"{keys.dtype} {tuple(keys.shape)}")
    if weights.shape != (t, h) or not weights.is_floating_point():
        raise ValueError(f"prefill_index_scores: weights must be float [T={t}, Hi={h}], got {weights.dtype} "
                         f"{tuple(weights.shape)}")
    if visible.shape != (t,) or visible.dtype != torch.int32:
        raise ValueError(f"prefill_index_scores: visible must be int32 [T={t}], got {visible.dtype} "
                         f"{tuple(visible.shape)}")
    n = keys.shape[0]
    out = torch.empty(t, n, dtype=torch.bfloat16, device=q.device)
    if t == 0 or n == 0:
        return out
    shape = (block_t, block_n, warps, stages)
    if not (PREFILL_FP8 and fp4 and n >= PREFILL_FP8_MIN_KEYS):
        _prefill_launch(q, weights, keys, visible, out, shape)
        return out
    from dsv4.kernels import indexer_fp8

    ok = torch.ones(1, dtype=torch.int32, device=q.device)
    q8, w8 = indexer_fp8.fold_rows(q, weights, ok)
    k8, sk = indexer_fp8.fold_rows(keys, None, ok)
    fp8_shape = PREFILL_SHAPE if shape == (None,) * 4 and not PREFILL_FP8_GLUON else shape
    _prefill_launch(q8, w8, k8, visible, out, fp8_shape, sk, ok, 1)
    _prefill_launch(q, weights, keys, visible, out, shape, None, ok, 2)
    return out


def _prefill_launch(q, weights, keys, visible, out, shape, sk=None, ok=None, guard=0) -> None:
    """One scores launch into out: the Gluon kernel from PREFILL_GLUON_MIN_KEYS keys (no launch shape asked for,
    where it applies), else the Triton kernel at `shape` (None parts: PREFILL_SHAPE's); guard as the kernels'."""
    t, h, di = q.shape
    n = keys.shape[0]
    if n >= PREFILL_GLUON_MIN_KEYS and not INTERPRET and shape == (None,) * 4:
        from dsv4.kernels import indexer_scores_gluon

        if indexer_scores_gluon.supports(q, keys):
            indexer_scores_gluon.prefill_index_scores_gluon(q, weights, keys, visible, out, sk, ok, guard)
            return
    block_t, block_n, warps, stages = (d if v is None else v for v, d in zip(shape, PREFILL_SHAPE))
    bn = max(16, min(block_n, triton.next_power_of_2(n)))
    _prefill_scores_kernel[(triton.cdiv(t, block_t), triton.cdiv(n, bn))](
        q, weights, keys, visible, out, t, n, h, q.stride(0), q.stride(1), weights.stride(0), weights.stride(1),
        keys.stride(0), out.stride(0), D=di, BT=block_t, BN=bn, INTERP=INTERPRET, PACKED=PACKED_RELU, SK=sk, OK=ok,
        GUARD=guard, num_warps=warps, num_stages=stages)
