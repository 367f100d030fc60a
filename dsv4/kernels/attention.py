"""Decode attention over the paged FP8 cache (spec §2.5), beside a torch reference of the same signature.

One query token per sequence b at position t = pos[b]. Its candidates, in one softmax with the sink:

* the window: positions max(0, t-W+1) .. t, read from the window ring (slot p mod ring) through the
  sequence's window block table — the caller inserts t's own kv first;
* compressed entries: either an index list `comp_idx [B, K]` (CSA: the indexer's top-k, -1 = empty)
  or, with `comp_idx=None`, the dense range 0 .. comp_count[b]-1 (HCA: every complete entry),
  read from the compressed pool through the compressed block table.

Pools use the engine's `fp8_ds_mla` split (dsv4/engine/paged_state.py): `q` e4m3 [pages, ps, nope],
`s` E8M0 bytes [pages, ps, nope/64], `rope` bf16 [pages, ps, Dh-nope]. K = V = the dequantised
512-d entry. Scores `q.k * scale` in fp32; the per-head sink logit joins the denominator only;
probabilities are rounded to bf16 for P.V (fp32 accumulation); the output is rounded to bf16 and its
rope dims rotated back by -t (inverse RoPE, fp32 math, bf16 result) -- or left as they are with
cos = sin = None, for a caller that applies the inverse RoPE itself.

Kernel: grid (B, ceil(H/16), splits); a program holds 16 heads x Dh in fp32 and walks its share of the
candidate list in blocks of 16 entries (gather + FP8 dequant in registers, two tensor-core dots,
online softmax). A block is gathered as [16, Dh/64, 64] -- 16-byte loads, one E8M0 byte per 64-column
chunk -- and reshaped for the dots: a per-element scale index (`d // 64`) put the whole tile in a
one-element-per-thread layout, 2-3x slower (session 19, docs/benchmarks.md). With one split it finishes
in place; otherwise a combine launch merges the splits (flash-decoding), adds the sink and applies the
inverse RoPE ("loop" or "wide" kernel, see COMBINE).
The candidates are split so that the grid is about one wave (`NUM_SMS`): at batch 1 the latency of a
program's serial block loop, not bandwidth, sets the time.
"""

from __future__ import annotations

from typing import Protocol

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton  # noqa: F401
from dsv4.kernels._triton import pdl_kernel, pdl_wait, rotate_pairs

KV_BLOCK = 64
# Split count: about one program per SM (H200: 132). Measured (bench/bench_glue.py --attn, ctx 4K): at B=1
# 16-32 splits are 1.5-3x faster than the old "2 per SM, >= 64 entries per split" rule, at B=8 4 splits.
NUM_SMS = 132
# Split merge: "loop" walks the splits serially (one [16, Dh] load per split, each waiting a memory latency,
# B*ceil(H/16) programs); "wide" loads all splits of a [BH, BD] tile at once over B*ceil(H/BH)*Dh/BD programs.
# `decode_attention(combine=...)` overrides this per call (for A/B benchmarks). Session 7 on the H200 (ctx 4K,
# whole decode attention incl. combine, µs): B=1 sliding 15.8 -> 12.0, CSA 32.7 -> 24.7, HCA 19.4 -> 16.6;
# B=8 19.9 -> 18.7, 93.1 -> 91.5, 34.5 -> 33.1 (docs/benchmarks.md #6, session 7).
COMBINE = "wide"
# Software pipelining of the candidate loop (Triton num_stages). Session 19: with the chunked `_load_kv` one stage
# needs 102-123 registers (two programs per SM), three need 212 (one) for a loop of 1-2 blocks at B = 1.
DECODE_STAGES = 1
WIDE_BD, WIDE_WARPS = 32, 4  # "wide": columns per program (at most), warps per program


class FP8Pool(Protocol):
    """What the kernel reads of a paged FP8 entry pool (`paged_state._EntryPool` with fp8=True)."""

    q: torch.Tensor  # e4m3 [pages, page_size, nope]
    s: torch.Tensor  # uint8 E8M0 [pages, page_size, nope / 64]
    rope: torch.Tensor  # bf16 [pages, page_size, Dh - nope]


# --------------------------------------------------------------------------- torch reference


def _gather(pool: FP8Pool, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Dequantised entries `index` (long [n]) of one sequence (table: its block table row), bf16 [n, Dh]."""
    ps = pool.q.shape[1]
    pages, offs = table.long()[index // ps], index % ps
    scale = torch.exp2(pool.s[pages, offs].float() - 127).repeat_interleave(KV_BLOCK, dim=-1)
    nope = (pool.q[pages, offs].float() * scale).to(torch.bfloat16)
    return torch.cat((nope, pool.rope[pages, offs].to(torch.bfloat16)), dim=-1)


def decode_attention_ref(q: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                         window_pool: FP8Pool, window_table: torch.Tensor, ring: int, window: int,
                         comp_pool: FP8Pool | None, comp_table: torch.Tensor | None,
                         comp_idx: torch.Tensor | None, comp_count: torch.Tensor | None,
                         sink: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                         q_norm: tuple | None = None) -> torch.Tensor:
    """Reference: per sequence, gather + dequantise, then the model's `sink_attention` and inverse RoPE
    (none with cos = sin = None); written into `out` when given. q_norm = (eps, cos, sin): q is before its
    per-head norm + RoPE by +t (`norm_rope`), applied first."""
    from dsv4.kernels.norm_rope import UNWEIGHTED, norm_rope_ref
    from dsv4.model.sink_attention import sink_attention
    from dsv4.model.rope import apply_rope

    if q_norm is not None:
        q = norm_rope_ref(q, norm=UNWEIGHTED, eps=q_norm[0], cos=q_norm[1], sin=q_norm[2])
    out = torch.empty_like(q) if out is None else out
    dev = q.device
    for b in range(q.shape[0]):
        t = int(pos[b])
        kpos = torch.arange(max(0, t - window + 1), t + 1, device=dev)
        keys = _gather(window_pool, window_table[b], kpos % ring)
        entries = mask = None
        if comp_pool is not None:
            if comp_idx is not None:
                idx = comp_idx[b][comp_idx[b] >= 0].long()
            else:
                idx = torch.arange(int(comp_count[b]), device=dev)
            if idx.numel():
                entries = _gather(comp_pool, comp_table[b], idx)
                mask = torch.ones(1, idx.numel(), dtype=torch.bool, device=dev)
        o = sink_attention(q[b:b + 1], pos[b:b + 1].long(), keys, kpos, window, entries, mask, sink.float(), scale)
        out[b] = o[0] if cos is None else apply_rope(o[0], cos[b].float(), -sin[b].float())
    return out


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:
    from dsv4.kernels.norm_rope import unweighted_norm_rows

    @triton.jit
    def _load_kv(PQ, PS, PR, row, valid, NOPE: tl.constexpr, ROPE: tl.constexpr):
        """Gather + dequantise entries at pool rows `row` [BN] -> bf16 [BN, Dh] (invalid rows = 0). Built as
        [BN, Dh/64, 64] (chunk c < NOPE/64: its e4m3 codes times the chunk's scale; later chunks: the bf16 rope
        dims) so that each thread holds contiguous columns: 16-byte loads and one scale per chunk, not a
        per-element byte gather."""
        NCH: tl.constexpr = (NOPE + ROPE) // 64
        ch = tl.arange(0, NCH)[None, :, None]  # [1, NCH, 1]
        col = tl.arange(0, 64)[None, None, :]  # [1, 1, 64]
        r3 = row[:, None, None]
        v3 = valid[:, None, None]
        is_nope = ch < NOPE // 64
        qv = tl.load(PQ + r3 * NOPE + ch * 64 + col, mask=v3 & is_nope, other=0.0)
        sb = tl.load(PS + r3 * (NOPE // 64) + ch, mask=v3 & is_nope, other=0)  # [BN, NCH, 1]
        sc = (sb.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # E8M0 byte -> 2^(b-127)
        rv = tl.load(PR + r3 * ROPE + (ch * 64 - NOPE) + col, mask=v3 & (~is_nope), other=0.0)
        kv = tl.where(is_nope, qv.to(tl.float32) * sc, rv.to(tl.float32)).to(tl.bfloat16)
        return tl.reshape(kv, (row.shape[0], NOPE + ROPE))

    @triton.jit
    def _window_kv(WQ, WS, WR, WTAB, b, t, offs_j, ring, w_ps, w_tab_stride, WIN: tl.constexpr, NOPE: tl.constexpr,
                   ROPE: tl.constexpr):
        """Candidates offs_j < WIN: positions t-WIN+1+j of the window ring -> (kv [BN, Dh], exists [BN])."""
        p = t - (WIN - 1) + offs_j
        v_w = (offs_j < WIN) & (p >= 0)
        slot = tl.where(v_w, p, 0) % ring
        w_page = tl.load(WTAB + b * w_tab_stride + slot // w_ps, mask=v_w, other=0)
        row_w = w_page.to(tl.int64) * w_ps + slot % w_ps
        return _load_kv(WQ, WS, WR, row_w, v_w, NOPE, ROPE), v_w

    @triton.jit
    def _comp_kv(CQ, CS, CR, CTAB, CIDX, b, offs_j, cnt, n_comp, c_ps, c_tab_stride, WIN: tl.constexpr,
                 INDEXED: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr):
        """Candidates WIN <= offs_j < WIN + n_comp: the indexer's picks (INDEXED, -1 = none) or the first `cnt`
        compressed entries -> (kv [BN, Dh], present [BN])."""
        c = offs_j - WIN
        v_c = (c >= 0) & (c < n_comp)
        if INDEXED:
            idx = tl.load(CIDX + b * n_comp + c, mask=v_c, other=-1)
            v_c = v_c & (idx >= 0)
        else:
            idx = c
            v_c = v_c & (c < cnt)
        idx = tl.where(v_c, idx, 0)
        c_page = tl.load(CTAB + b * c_tab_stride + idx // c_ps, mask=v_c, other=0)
        row_c = c_page.to(tl.int64) * c_ps + idx % c_ps
        return _load_kv(CQ, CS, CR, row_c, v_c, NOPE, ROPE), v_c

    @triton.jit
    def _rotate_rope(o, COS, SIN, b, sign, HD: tl.constexpr, NOPE: tl.constexpr, BH: tl.constexpr):
        """The rope pairs of rows o [BH, HD] (fp32 of bf16 values) rotated by sign x t, as `norm_rope` rotates."""
        ev, od = tl.split(tl.reshape(o, (BH, HD // 2, 2)))
        pair = tl.arange(0, HD // 2)
        rp = pair >= NOPE // 2
        c = tl.load(COS + b * ((HD - NOPE) // 2) + (pair - NOPE // 2), mask=rp, other=1.0)[None, :]
        sn = sign * tl.load(SIN + b * ((HD - NOPE) // 2) + (pair - NOPE // 2), mask=rp, other=0.0)[None, :]
        return tl.reshape(tl.join(*rotate_pairs(ev, od, c, sn)), (BH, HD))

    @triton.jit
    def _inverse_rope_store(o, OUT, COS, SIN, b, offs_h, hmask, HD: tl.constexpr, NOPE: tl.constexpr,
                            BH: tl.constexpr, ROT: tl.constexpr):
        """Round o [BH, HD] to bf16 (the reference output), rotate its rope pairs by -t (ROT), store bf16."""
        o = o.to(tl.bfloat16).to(tl.float32)
        if ROT:
            o = _rotate_rope(o, COS, SIN, b, -1.0, HD, NOPE, BH)  # norm_rope(inverse=True)'s bits
        offs_d = tl.arange(0, HD)
        tl.store(OUT + offs_h[:, None] * HD + offs_d[None, :], o.to(tl.bfloat16),
                 mask=hmask[:, None])

    @pdl_kernel
    @triton.jit
    def _decode_attn_kernel(
        Q, POS, COS, SIN, SINK, OUT, PACC, PML,
        WQ, WS, WR, WTAB, CQ, CS, CR, CTAB, CIDX, CCNT,
        H, ring, w_ps, c_ps, w_tab_stride, c_tab_stride, n_comp, per_split, scale,
        WIN: tl.constexpr, HAS_COMP: tl.constexpr, INDEXED: tl.constexpr, SPLIT: tl.constexpr,
        HD: tl.constexpr, NOPE: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr, ROT: tl.constexpr,
        INTERP: tl.constexpr, QCOS=None, QSIN=None, q_eps=0.0, QNORM: tl.constexpr = False,
    ):
        pdl_wait()
        b = tl.program_id(0)
        pid_h = tl.program_id(1)
        sid = tl.program_id(2)
        ROPE: tl.constexpr = HD - NOPE
        offs_h = pid_h * BH + tl.arange(0, BH)
        hmask = offs_h < H
        offs_d = tl.arange(0, HD)
        q = tl.load(Q + (b * H + offs_h[:, None]) * HD + offs_d[None, :], mask=hmask[:, None], other=0.0)
        if QNORM:  # q before its per-head norm + RoPE by +t: `norm_rope`'s bits (`decode_attention(q_norm=)`)
            q = unweighted_norm_rows(q.to(tl.float32), q_eps, HD)
            q = _rotate_rope(q, QCOS, QSIN, b, 1.0, HD, NOPE, BH).to(tl.bfloat16)
        t = tl.load(POS + b)
        cnt = 0
        if HAS_COMP and not INDEXED:
            cnt = tl.load(CCNT + b)
        m_i = tl.full((BH,), -1.0e30, tl.float32)
        l_i = tl.zeros((BH,), tl.float32)
        acc = tl.zeros((BH, HD), tl.float32)
        j_lo = sid * per_split
        for jj in range(0, per_split, BN):
            j0 = j_lo + jj
            offs_j = j0 + tl.arange(0, BN)
            if HAS_COMP:
                if WIN % BN == 0:  # a block is all window or all compressed candidates: load one source
                    if j0 < WIN:
                        kv, valid = _window_kv(WQ, WS, WR, WTAB, b, t, offs_j, ring, w_ps, w_tab_stride, WIN, NOPE,
                                               ROPE)
                    else:
                        kv, valid = _comp_kv(CQ, CS, CR, CTAB, CIDX, b, offs_j, cnt, n_comp, c_ps, c_tab_stride,
                                             WIN, INDEXED, NOPE, ROPE)
                else:
                    kv, valid = _window_kv(WQ, WS, WR, WTAB, b, t, offs_j, ring, w_ps, w_tab_stride, WIN, NOPE, ROPE)
                    kv_c, v_c = _comp_kv(CQ, CS, CR, CTAB, CIDX, b, offs_j, cnt, n_comp, c_ps, c_tab_stride, WIN,
                                         INDEXED, NOPE, ROPE)
                    kv += kv_c  # disjoint masks: one of the two is 0
                    valid = valid | v_c
            else:
                kv, valid = _window_kv(WQ, WS, WR, WTAB, b, t, offs_j, ring, w_ps, w_tab_stride, WIN, NOPE, ROPE)
            if INTERP:  # the CPU interpreter multiplies bf16 dot operands as raw bits
                s = tl.dot(q.to(tl.float32), tl.trans(kv.to(tl.float32))) * scale
            else:
                s = tl.dot(q, tl.trans(kv)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            pr = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(pr, axis=1)
            pb = pr.to(tl.bfloat16)
            if INTERP:
                acc = acc * alpha[:, None] + tl.dot(pb.to(tl.float32), kv.to(tl.float32))
            else:
                acc = tl.dot(pb, kv, acc * alpha[:, None])
            m_i = m_new
        if SPLIT:
            base = (b * tl.num_programs(2) + sid) * H + offs_h
            tl.store(PACC + base[:, None] * HD + offs_d[None, :], acc, mask=hmask[:, None])
            tl.store(PML + base * 2, m_i, mask=hmask)
            tl.store(PML + base * 2 + 1, l_i, mask=hmask)
        else:
            sink = tl.load(SINK + offs_h, mask=hmask, other=0.0)
            o = acc / (l_i + tl.exp(sink - m_i))[:, None]
            _inverse_rope_store(o, OUT + b * H * HD, COS, SIN, b, offs_h, hmask, HD, NOPE, BH, ROT)

    @triton.jit
    def _combine_kernel(PACC, PML, SINK, COS, SIN, OUT, H, n_split,
                        HD: tl.constexpr, NOPE: tl.constexpr, BH: tl.constexpr, SP: tl.constexpr, ROT: tl.constexpr):
        b = tl.program_id(0)
        offs_h = tl.program_id(1) * BH + tl.arange(0, BH)
        hmask = offs_h < H
        offs_s = tl.arange(0, SP)
        smask = offs_s < n_split
        ml = PML + ((b * n_split + offs_s[:, None]) * H + offs_h[None, :]) * 2
        m_s = tl.load(ml, mask=smask[:, None] & hmask[None, :], other=-1.0e30)  # [SP, BH]
        l_s = tl.load(ml + 1, mask=smask[:, None] & hmask[None, :], other=0.0)
        m = tl.max(m_s, axis=0)
        w = tl.exp(m_s - m[None, :])
        sink = tl.load(SINK + offs_h, mask=hmask, other=0.0)
        denom = tl.sum(w * l_s, axis=0) + tl.exp(sink - m)
        offs_d = tl.arange(0, HD)
        o = tl.zeros((BH, HD), tl.float32)
        for s in range(0, n_split):
            ws = tl.sum(tl.where(offs_s[:, None] == s, w, 0.0), axis=0)
            a = tl.load(PACC + ((b * n_split + s) * H + offs_h[:, None]) * HD + offs_d[None, :],
                        mask=hmask[:, None], other=0.0)
            o += ws[:, None] * a
        _inverse_rope_store(o / denom[:, None], OUT + b * H * HD, COS, SIN, b, offs_h, hmask, HD, NOPE, BH, ROT)

    @pdl_kernel
    @triton.jit
    def _combine_wide_kernel(PACC, PML, SINK, COS, SIN, OUT, H, n_split,
                             HD: tl.constexpr, NOPE: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
                             SP: tl.constexpr, ROT: tl.constexpr):
        """`_combine_kernel` without the serial split walk: grid (B, ceil(H/BH), HD/BD); a program loads all
        SP splits of its [BH, BD] tile at once (the loads overlap instead of each waiting a latency)."""
        pdl_wait()
        b = tl.program_id(0)
        offs_h = tl.program_id(1) * BH + tl.arange(0, BH)
        d0 = tl.program_id(2) * BD
        hmask = offs_h < H
        offs_s = tl.arange(0, SP)
        m3 = (offs_s < n_split)[:, None, None] & hmask[None, :, None]  # [SP, BH, 1]
        row = (b * n_split + offs_s[:, None, None]) * H + offs_h[None, :, None]
        m_s = tl.load(PML + row * 2, mask=m3, other=-1.0e30)  # [SP, BH, 1]: broadcasts over the tile's columns
        l_s = tl.load(PML + row * 2 + 1, mask=m3, other=0.0)
        offs_d = d0 + tl.arange(0, BD)
        a = tl.load(PACC + row * HD + offs_d[None, None, :], mask=m3, other=0.0)  # [SP, BH, BD]
        m = tl.max(m_s, axis=0)  # [BH, 1]
        w = tl.exp(m_s - m[None])
        sink = tl.load(SINK + offs_h, mask=hmask, other=0.0)
        denom = tl.sum(w * l_s, axis=0) + tl.exp(sink[:, None] - m)
        o = (tl.sum(w * a, axis=0) / denom).to(tl.bfloat16).to(tl.float32)  # [BH, BD], rounded as the reference
        if ROT:  # pairs (2i, 2i+1) lie in one tile (BD even); only pairs past NOPE rotate
            ev, od = tl.split(tl.reshape(o, (BH, BD // 2, 2)))
            pair = d0 // 2 + tl.arange(0, BD // 2)
            rp = pair >= NOPE // 2
            c = tl.load(COS + b * ((HD - NOPE) // 2) + (pair - NOPE // 2), mask=rp, other=1.0)[None, :]
            sn = -tl.load(SIN + b * ((HD - NOPE) // 2) + (pair - NOPE // 2), mask=rp, other=0.0)[None, :]
            o = tl.reshape(tl.join(*rotate_pairs(ev, od, c, sn)), (BH, BD))
        tl.store(OUT + (b * H + offs_h[:, None]) * HD + offs_d[None, :], o.to(tl.bfloat16), mask=hmask[:, None])


# --------------------------------------------------------------------------- launcher


def _check_pool(pool: FP8Pool, name: str, hd: int) -> int:
    if pool.q.dtype != torch.float8_e4m3fn or pool.s.dtype != torch.uint8 or pool.rope.dtype != torch.bfloat16:
        raise ValueError(f"decode_attention: {name} must be an FP8 pool (e4m3 q, uint8 E8M0 s, bf16 rope), got "
                         f"{pool.q.dtype}/{pool.s.dtype}/{pool.rope.dtype}")
    nope = pool.q.shape[-1]
    if nope % KV_BLOCK or pool.s.shape[-1] != nope // KV_BLOCK or nope + pool.rope.shape[-1] != hd:
        raise ValueError(f"decode_attention: {name} widths {nope}+{pool.rope.shape[-1]} (scales {pool.s.shape[-1]}) "
                         f"do not make head_dim {hd}")
    for t in (pool.q, pool.s, pool.rope):
        if not t.is_contiguous():
            raise ValueError(f"decode_attention: {name} tensors must be contiguous")
    return nope


def _index(t: torch.Tensor) -> torch.Tensor:
    """Index tensors go to the kernel as int32 or int64 as they are (a conversion is one more launch
    per layer in the captured step); other dtypes become int32."""
    t = t if t.dtype in (torch.int32, torch.int64) else t.to(torch.int32)
    return t.contiguous()


def decode_attention(q: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
                     window_pool: FP8Pool, window_table: torch.Tensor, ring: int, window: int,
                     comp_pool: FP8Pool | None, comp_table: torch.Tensor | None,
                     comp_idx: torch.Tensor | None, comp_count: torch.Tensor | None,
                     sink: torch.Tensor, scale: float, splits: int | None = None,
                     out: torch.Tensor | None = None, combine: str | None = None,
                     q_norm: tuple | None = None) -> torch.Tensor:
    """Triton decode attention (contract of `decode_attention_ref`): bf16 [B, H, Dh]. cos = sin = None
    skips the inverse RoPE (the caller applies it); `out` (contiguous bf16 [B, H, Dh]) receives the result;
    `combine` ("loop" / "wide", None = the module's COMBINE) picks the split-merge kernel; q_norm = (eps,
    cos, sin): q's per-head norm + RoPE in the kernel (one `norm_rope` launch fewer; each program of a row
    normalises its heads' q again)."""
    if not HAS_TRITON:
        raise RuntimeError("dsv4.kernels.attention: triton is not installed (use decode_attention_ref)")
    combine = COMBINE if combine is None else combine
    if combine not in ("loop", "wide"):
        raise ValueError(f"decode_attention: combine must be 'loop' or 'wide', got {combine!r}")
    if q.dim() != 3 or q.dtype != torch.bfloat16:
        raise ValueError(f"decode_attention: q must be bf16 [B, H, Dh], got {q.dtype} {tuple(q.shape)}")
    bsz, h, hd = q.shape
    if hd & (hd - 1) or hd % KV_BLOCK:
        raise ValueError(f"decode_attention: head_dim {hd} must be a power of two and a multiple of {KV_BLOCK}")
    nope = _check_pool(window_pool, "window_pool", hd)
    rot = cos is not None
    if (sin is not None) != rot:
        raise ValueError("decode_attention: give both cos and sin, or neither (no inverse RoPE)")
    if pos.shape != (bsz,) or (rot and (cos.shape != (bsz, (hd - nope) // 2) or sin.shape != cos.shape)):
        raise ValueError(f"decode_attention: pos {tuple(pos.shape)} / cos {None if cos is None else tuple(cos.shape)}"
                         f" / sin {None if sin is None else tuple(sin.shape)} do not match B={bsz}, rope pairs "
                         f"{(hd - nope) // 2}")
    if out is not None and (out.shape != q.shape or out.dtype != torch.bfloat16 or not out.is_contiguous()
                            or out.device != q.device):
        raise ValueError(f"decode_attention: out must be contiguous bf16 {tuple(q.shape)} on {q.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    if q_norm is not None and (len(q_norm) != 3 or q_norm[1].shape != (bsz, (hd - nope) // 2)
                               or q_norm[2].shape != q_norm[1].shape):
        raise ValueError(f"decode_attention: q_norm must be (eps, cos, sin) with cos / sin [B={bsz}, "
                         f"{(hd - nope) // 2}]")
    if window_table.dim() != 2 or window_table.shape[0] != bsz:
        raise ValueError(f"decode_attention: window_table must be [B, pages], got {tuple(window_table.shape)}")
    has_comp = comp_pool is not None
    indexed = comp_idx is not None
    n_comp = 0
    if has_comp:
        _check_pool(comp_pool, "comp_pool", hd)
        if comp_table is None or comp_table.dim() != 2 or comp_table.shape[0] != bsz:
            raise ValueError("decode_attention: comp_table must be [B, pages] when comp_pool is given")
        if indexed:
            if comp_idx.dim() != 2 or comp_idx.shape[0] != bsz:
                raise ValueError(f"decode_attention: comp_idx must be [B, K], got {tuple(comp_idx.shape)}")
            n_comp = comp_idx.shape[1]
        else:
            if comp_count is None or comp_count.shape != (bsz,):
                raise ValueError("decode_attention: give comp_idx [B, K] or comp_count [B]")
            n_comp = int(comp_table.shape[1]) * comp_pool.q.shape[1]  # upper bound; masked by the count
    dev = q.device
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    bh, bn = 16, 16
    hblocks = triton.cdiv(h, bh)
    n_cand = window + n_comp
    if splits is None:  # one wave of programs over the SMs, at least one 16-entry block per split
        splits = max(1, min(triton.cdiv(n_cand, bn), NUM_SMS // (bsz * hblocks)))
    per_split = triton.cdiv(triton.cdiv(n_cand, splits), bn) * bn
    splits = triton.cdiv(n_cand, per_split)
    q = q.contiguous()
    pos32, wtab = _index(pos), _index(window_table)
    cos, sin = (cos.float().contiguous(), sin.float().contiguous()) if rot else (pos32, pos32)  # unread if not rot
    sink = sink.float().contiguous()
    cp = comp_pool if has_comp else window_pool
    ctab = _index(comp_table) if has_comp else wtab
    cidx = _index(comp_idx) if indexed else wtab
    ccnt = _index(comp_count) if (has_comp and not indexed) else pos32
    if splits > 1:
        pacc = torch.empty(bsz, splits, h, hd, dtype=torch.float32, device=dev)
        pml = torch.empty(bsz, splits, h, 2, dtype=torch.float32, device=dev)
    else:
        pacc = pml = out
    _decode_attn_kernel[(bsz, hblocks, splits)](
        q, pos32, cos, sin, sink, out, pacc, pml,
        window_pool.q, window_pool.s, window_pool.rope, wtab, cp.q, cp.s, cp.rope, ctab, cidx, ccnt,
        h, ring, window_pool.q.shape[1], cp.q.shape[1], wtab.stride(0), ctab.stride(0), n_comp, per_split,
        float(scale),
        WIN=window, HAS_COMP=has_comp, INDEXED=indexed, SPLIT=splits > 1, HD=hd, NOPE=nope, BH=bh, BN=bn,
        ROT=rot, INTERP=INTERPRET, num_warps=8, num_stages=DECODE_STAGES,
        **({} if q_norm is None else dict(QCOS=q_norm[1].float().contiguous(), QSIN=q_norm[2].float().contiguous(),
                                          q_eps=float(q_norm[0]), QNORM=True)),
    )
    sp = max(2, triton.next_power_of_2(splits))
    if splits > 1 and combine == "loop":
        _combine_kernel[(bsz, hblocks)](pacc, pml, sink, cos, sin, out, h, splits, HD=hd, NOPE=nope, BH=bh,
                                        SP=sp, ROT=rot, num_warps=8)
    elif splits > 1:  # tile [sp, bh, bd] of fp32 partials: about 64 per thread
        budget = 64 * 32 * WIDE_WARPS
        bd = min(WIDE_BD, hd, max(2, budget // sp))
        wbh = max(1, min(16, triton.next_power_of_2(h), budget // (sp * bd)))
        _combine_wide_kernel[(bsz, triton.cdiv(h, wbh), hd // bd)](
            pacc, pml, sink, cos, sin, out, h, splits, HD=hd, NOPE=nope, BH=wbh, BD=bd, SP=sp, ROT=rot,
            num_warps=WIDE_WARPS)
    return out
