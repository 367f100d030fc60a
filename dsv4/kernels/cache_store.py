"""The paged decode step's cache writes as two fused kernels (dsv4.engine.paged_decode), beside torch
references of the same signatures:

* `pool_windows` — the compressor pooling of the window containing t, every row of the batch: the
  raw (C, Z) rows read straight from the state pool (CSA: the previous window's A halves, zero weight
  for entry 0), softmax over the window per column, weighted sum -> fp32 [B, d].
* `pool_chunk` — the same pooling for the windows a prefill chunk closes, over the chunk's rows (with the
  state's rows before it) held contiguously: the window rows are addressed from the entry index, so one launch.
* `load_rows` — the reverse for a prefill chunk's reads: slots (page, off) of an FP8 / FP4 pool -> bf16 rows,
  dequantised exactly as `_EntryPool.read` does (one launch instead of ≈ 16 torch ops).
* `store_rows` — rows -> the pool slot (page, off) in one launch, for the FP8/FP4 pools of the
  reference numerics: optionally round fp32 -> bf16, RMSNorm, RoPE on the trailing pairs (compressed
  entries: at position i*r), then e4m3 + one E8M0 byte per 64 nope dims with the rope dims in bf16
  (window kv, compressed entries), or Hadamard rotation + MXFP4 (indexer keys).

Numerics are those of the torch path (`Compressor.finish_at` + `_EntryPool.write`): the torch path
FP8-simulates and then quantises again for storage, which is lossless, so one quantisation here
stores the same values (the scale byte may differ by one when the block maximum rounded down; the
dequantised entry is identical). fp32 sums run in another order than torch's (RMS, softmax, Hadamard):
results agree to fp32 rounding, hence to bf16 except at rare rounding ties.
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, arrival_counters, tl, triton
from dsv4.kernels._triton import pdl_kernel, pdl_wait, rotate_pairs

KV_BLOCK = 64
_KV_BLOCK = tl.constexpr(KV_BLOCK) if HAS_TRITON else KV_BLOCK  # what a jitted function may read


# --------------------------------------------------------------------------- torch references

def pool_windows_ref(rows_c: torch.Tensor, rows_z: torch.Tensor, page: torch.Tensor, slots: torch.Tensor,
                     has_prev: torch.Tensor, ratio: int, dim: int, new_rows: tuple | None = None) -> torch.Tensor:
    """rows_c/rows_z [pages, cap, w] fp32 (one compressor's state pool); page [B]; slots [B, R] ring
    slots of the window's positions (R = 2r with the previous window first when w = 2*dim, else r);
    has_prev [B] -> pooled [B, dim] fp32. `new_rows = (c, z, slot)` ([B, w], [B, w], [B]) first
    stores this step's rows at (page, slot) of the pools."""
    from dsv4.model.compressor import pool_window
    if new_rows is not None:
        c, z, slot = new_rows
        rows_c[page, slot] = c.to(rows_c.dtype)
        rows_z[page, slot] = z.to(rows_z.dtype)
    return pool_window(rows_c[page[:, None], slots], rows_z[page[:, None], slots], has_prev, ratio, dim)


def _check_chunk_rows(rows: int, first: int, entry0: int, n: int, ratio: int, overlap: bool) -> None:
    """Rows of positions [first, first + rows) must hold the windows of entries [entry0, entry0 + n) (CSA: the
    previous window's too, from entry 1 on)."""
    if overlap and entry0 > 0 and (entry0 - 1) * ratio < first or (entry0 + n) * ratio - first > rows:
        raise RuntimeError(f"pool_chunk: rows of positions [{first}, {first + rows}) do not hold the windows "
                           f"of entries [{entry0}, {entry0 + n}) (ratio {ratio})")


def _chunk_windows(c: torch.Tensor, first: int, entry0: int, n: int, ratio: int, overlap: bool):
    """Row indices into c (rows of positions first..) of entries entry0 .. entry0 + n - 1's windows [n, R]
    (clamped to 0 for entry 0's missing previous window) and has_prev [n]."""
    _check_chunk_rows(c.shape[0], first, entry0, n, ratio, overlap)
    span = 2 * ratio if overlap else ratio
    entry = torch.arange(entry0, entry0 + n, device=c.device)
    rows = entry[:, None] * ratio - first - (ratio if overlap else 0) + torch.arange(span, device=c.device)[None, :]
    return rows.clamp_min(0), entry > 0


def ring_rows(past: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a compressor ring `past` = (c, z [cap, w], start, count): ring rows start, start + 1, ... (mod
    cap), count of them, as views, or one copy each where they wrap around the ring's end."""
    c, z, start, count = past
    cap = c.shape[0]
    if start + count <= cap:
        return c[start:start + count], z[start:start + count]
    return (torch.cat((c[start:], c[:start + count - cap])), torch.cat((z[start:], z[:start + count - cap])))


def pool_chunk_ref(c: torch.Tensor, z: torch.Tensor, first: int, entry0: int, n: int, ratio: int,
                   dim: int, past: tuple | None = None) -> torch.Tensor:
    """c/z [L, w] fp32: the compressor rows of positions first .. first + L - 1 (w = 2*dim for CSA, whose
    windows also take the previous window's A halves) -> the pooled rows of entries entry0 .. entry0 + n - 1,
    fp32 [n, dim], as `Compressor.pool` computes them. past (a ring, as `ring_rows` takes it): the rows of
    positions first .. that come before c / z's (which then start after them)."""
    from dsv4.model.compressor import pool_window
    if past is not None:
        pc, pz = ring_rows(past)
        c, z = torch.cat((pc, c)), torch.cat((pz, z))
    rows, has_prev = _chunk_windows(c, first, entry0, n, ratio, c.shape[-1] == 2 * dim)
    return pool_window(c[rows], z[rows], has_prev, ratio, dim)


def store_rows_ref(x: torch.Tensor, page: torch.Tensor, off: torch.Tensor, pool, *, norm_weight=None,
                   eps: float = 0.0, cos=None, sin=None, hadamard=None) -> None:
    """x [B, D] (fp32 pooled rows are rounded to bf16 first); optional RMSNorm(norm_weight), RoPE
    with cos/sin [B, rope/2], Hadamard [D, D] (indexer keys); stored into `pool`
    (a dsv4.engine.paged_state._EntryPool with fp8 or fp4 storage) at (page, off)."""
    from dsv4.kernels.norm_rope import NONE, WEIGHTED, norm_rope_ref
    y = norm_rope_ref(x.to(torch.bfloat16), norm=NONE if norm_weight is None else WEIGHTED, weight=norm_weight,
                      eps=eps, cos=cos, sin=sin)
    if hadamard is not None:
        y = (y.float() @ hadamard.float()).to(torch.bfloat16)
    pool.write(page, off, y)


# --------------------------------------------------------------------------- Triton kernels

if HAS_TRITON:
    from dsv4.kernels.fp8_linear import _e4m3, _e8m0_to_f32, _pow2_scale

    @pdl_kernel
    @triton.jit
    def _pool_kernel(C, Z, PAGE, SLOTS, HAS_PREV, OUT, NC, NZ, NSLOT, stride_p, stride_s, stride_sl, stride_o,
                     stride_n, first, entry0, R: tl.constexpr, RR: tl.constexpr, RATIO: tl.constexpr,
                     DIM: tl.constexpr, OVERLAP: tl.constexpr, BD: tl.constexpr, NEW: tl.constexpr,
                     CHUNK: tl.constexpr, CNT=None, SPAGE=None, SOFF=None, W=None, COS=None, SIN=None, H=None,
                     SQ=None, SS=None, SR=None, stride_cs=0, q_page=0, q_off=0, s_page=0, s_off=0, r_page=0, r_off=0,
                     eps=0.0, STORE: tl.constexpr = False, NOPE: tl.constexpr = 0, ROPE0: tl.constexpr = 0,
                     ROT: tl.constexpr = False, HADAMARD: tl.constexpr = False, FP4: tl.constexpr = False,
                     BACK: tl.constexpr = 0, n_past=0, past_start=0, past_cap=1, PAST: tl.constexpr = False):
        """Window b's pooled row. CHUNK (`pool_chunk`): entry entry0 + b over contiguous rows of positions
        first.. (C, Z [L, w]; PAST: the first n_past of them in the ring NC / NZ [past_cap, w] from row past_start
        on, row stride stride_n, C / Z the rest); otherwise the window's (page, slots) in the state pool. STORE
        (`pool_windows(store=)`): the row's last-arriving column program also stores the whole row as `store_rows`
        does."""
        pdl_wait()
        b = tl.program_id(0)
        cols = tl.program_id(1) * BD + tl.arange(0, BD)
        j = tl.arange(0, RR)
        valid = j < R
        if CHUNK:
            entry = entry0 + b
            slot = tl.maximum(entry * RATIO - first - (RATIO if OVERLAP else 0) + j, 0)
            prev = entry > 0
            page = 0
        else:
            slot = tl.load(SLOTS + b * stride_sl + j, mask=valid, other=0)
            prev = tl.load(HAS_PREV + b) != 0
            page = tl.load(PAGE + b).to(tl.int64)
        base = page * stride_p + slot.to(tl.int64) * stride_s
        if OVERLAP:
            col0 = tl.where(j < RATIO, 0, DIM)
            valid = valid & ((j >= RATIO) | prev)
        else:
            col0 = j * 0
        if PAST:  # two sources, no cat: rows before n_past from the state's ring (NC / NZ), the rest from C / Z
            past = (slot < n_past)[:, None]
            offs = (tl.maximum(slot - n_past, 0).to(tl.int64) * stride_s)[:, None] + col0[:, None] + cols[None, :]
            ring = past_start + slot
            ring = tl.where(ring >= past_cap, ring - past_cap, ring)
            poffs = (ring.to(tl.int64) * stride_n)[:, None] + col0[:, None] + cols[None, :]
            here, there = valid[:, None] & past, valid[:, None] & (slot >= n_past)[:, None]
            c = tl.where(past, tl.load(NC + poffs, mask=here, other=0.0), tl.load(C + offs, mask=there, other=0.0))
            z = tl.where(past, tl.load(NZ + poffs, mask=here, other=float("-inf")),
                         tl.load(Z + offs, mask=there, other=float("-inf")))
        else:
            offs = base[:, None] + col0[:, None] + cols[None, :]
            c = tl.load(C + offs, mask=valid[:, None], other=0.0)
            z = tl.load(Z + offs, mask=valid[:, None], other=float("-inf"))
        if NEW:  # this step's row: stored for later steps, and used here in place of the pool's copy
            ns = tl.load(NSLOT + b)
            here = (slot == ns)[:, None] & valid[:, None]
            noffs = b * stride_n + col0[:, None] + cols[None, :]
            c = tl.where(here, tl.load(NC + noffs, mask=here, other=0.0), c)
            z = tl.where(here, tl.load(NZ + noffs, mask=here, other=0.0), z)
            # an MTP verify step's earlier rows of the same sequence (same state page, up to BACK rows before b):
            # their new rows are read from NC / NZ too, not from the pool their programs store them into in this
            # launch (a race: session 50 saw run-to-run differences of the multi-token steps' logits)
            for k in tl.static_range(BACK):
                bk = tl.maximum(b - 1 - k, 0)
                same = (b - 1 - k >= 0) & (tl.load(PAGE + bk).to(tl.int64) == page)
                hit = (same & (slot == tl.load(NSLOT + bk)))[:, None] & valid[:, None]
                koffs = bk * stride_n + col0[:, None] + cols[None, :]
                c = tl.where(hit, tl.load(NC + koffs, mask=hit, other=0.0), c)
                z = tl.where(hit, tl.load(NZ + koffs, mask=hit, other=0.0), z)
            dst = page * stride_p + ns.to(tl.int64) * stride_s + cols
            # every load before the first store: a load after a store that may alias it stays after it, so the
            # interleaved copies waited one L2 latency each (session 43, H200: the eager B = 1 step's 3 pool launches
            # 13 -> 11 µs)
            nc, nz = tl.load(NC + b * stride_n + cols), tl.load(NZ + b * stride_n + cols)
            if OVERLAP:
                nc2, nz2 = tl.load(NC + b * stride_n + DIM + cols), tl.load(NZ + b * stride_n + DIM + cols)
            tl.store(C + dst, nc)
            tl.store(Z + dst, nz)
            if OVERLAP:
                tl.store(C + dst + DIM, nc2)
                tl.store(Z + dst + DIM, nz2)
        m = tl.max(z, axis=0)
        e = tl.exp(z - m[None, :])
        w = e / tl.sum(e, axis=0)[None, :]
        tl.store(OUT + b * stride_o + cols, tl.sum(w * c, axis=0))
        if STORE:  # the CTA barrier puts every thread's row stores before the gpu-scope atomic (`split_k_sum`)
            tl.debug_barrier()
            if tl.atomic_add(CNT + b, 1, sem="acq_rel", scope="gpu") == tl.num_programs(1) - 1:
                tl.debug_barrier()
                d = tl.arange(0, DIM)
                y = tl.load(OUT + b * stride_o + d, cache_modifier=".cg")  # (past the non-coherent L1)
                tl.store(CNT + b, 0)  # (left zeroed for the next launch / replay: `arrival_counters`)
                wn = tl.load(W + d).to(tl.float32)
                h = 0.0
                if HADAMARD:
                    h = tl.load(H + d[:, None] * DIM + d[None, :])
                _finish_store(y, wn, h, b, SPAGE, SOFF, COS, SIN, SQ, SS, SR, stride_cs, q_page, q_off, s_page,
                              s_off, r_page, r_off, eps, DIM, NOPE, ROPE0, True, ROT, HADAMARD, FP4)

    @triton.jit
    def _e2m1_code(v):
        """RNE e2m1 code (0..15) of fp32 v already divided by its scale (|v| <= 6)."""
        a = tl.abs(v)
        code = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) \
            + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
        sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
        return code | (sign << 3)

    @pdl_kernel
    @triton.jit
    def _store_kernel(X, PAGE, OFF, W, COS, SIN, H, Q, S, ROPE, stride_x, stride_cs,
                      q_page, q_off, s_page, s_off, r_page, r_off, eps,
                      D: tl.constexpr, NOPE: tl.constexpr, ROPE0: tl.constexpr, NORM: tl.constexpr, ROT: tl.constexpr,
                      HADAMARD: tl.constexpr, FP4: tl.constexpr):
        d = tl.arange(0, D)
        wn = 0.0
        h = 0.0
        if NORM:  # the static operands are read before the PDL wait (beside the previous kernel's tail)
            wn = tl.load(W + d).to(tl.float32)
        if HADAMARD:
            h = tl.load(H + d[:, None] * D + d[None, :])
        pdl_wait()
        b = tl.program_id(0)
        y = tl.load(X + b * stride_x + d)
        _finish_store(y, wn, h, b, PAGE, OFF, COS, SIN, Q, S, ROPE, stride_cs, q_page, q_off, s_page, s_off, r_page,
                      r_off, eps, D, NOPE, ROPE0, NORM, ROT, HADAMARD, FP4)

    @triton.jit
    def _finish_store(y, wn, h, b, PAGE, OFF, COS, SIN, Q, S, ROPE, stride_cs, q_page, q_off, s_page, s_off, r_page,
                      r_off, eps, D: tl.constexpr, NOPE: tl.constexpr, ROPE0: tl.constexpr, NORM: tl.constexpr,
                      ROT: tl.constexpr, HADAMARD: tl.constexpr, FP4: tl.constexpr):
        """Row b's y [D] rounded to bf16, RMSNorm (wn), RoPE on its trailing pairs, Hadamard (h), into its pool slot
        (`store_rows`' contract; also the last arriver of `pool_windows(store=)`)."""
        y = y.to(tl.bfloat16).to(tl.float32)
        if NORM:
            ms = tl.sum(y * y, axis=0) / D
            y = (wn * (y * tl.math.rsqrt(ms + eps))).to(tl.bfloat16).to(tl.float32)
        if ROT:
            a, c = tl.split(tl.reshape(y, (D // 2, 2)))
            pair = tl.arange(0, D // 2)
            rope = pair >= ROPE0 // 2  # the trailing pairs
            cs = tl.load(COS + b * stride_cs + pair - ROPE0 // 2, mask=rope, other=1.0)
            sn = tl.load(SIN + b * stride_cs + pair - ROPE0 // 2, mask=rope, other=0.0)
            y = tl.reshape(tl.join(*rotate_pairs(a, c, cs, sn)), (D,)).to(tl.bfloat16).to(tl.float32)
        if HADAMARD:
            y = tl.sum(y[:, None] * h, axis=0).to(tl.bfloat16).to(tl.float32)
        store_row(y, b, PAGE, OFF, Q, S, ROPE, q_page, q_off, s_page, s_off, r_page, r_off, D, NOPE, FP4)

    @triton.jit
    def store_row(y, b, PAGE, OFF, Q, S, ROPE, q_page, q_off, s_page, s_off, r_page, r_off,
                  D: tl.constexpr, NOPE: tl.constexpr, FP4: tl.constexpr):
        """Row y (fp32 [D] of bf16 values) into slot (PAGE[b], OFF[b]) of an FP8 pool (e4m3 + E8M0 per 64 of the NOPE
        dims, the rest bf16) or an FP4 one (MXFP4); also `norm_rope_two`'s store of the window kv."""
        d = tl.arange(0, D)
        page = tl.load(PAGE + b).to(tl.int64)
        off = tl.load(OFF + b).to(tl.int64)
        if FP4:  # MXFP4: 32-element groups, s = pow2_ceil(max(amax, 6*2^-126) * fp32(1/6))
            g = tl.reshape(y, (D // 32, 32))
            v = tl.maximum(tl.max(tl.abs(g), axis=1), 6.0 * 1.1754943508222875e-38) * 0.16666667163372040
            bits = v.to(tl.int32, bitcast=True)
            e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
            inv = ((254 - e) << 23).to(tl.float32, bitcast=True)
            code = _e2m1_code(tl.reshape(g * inv[:, None], (D,)))
            lo, hi = tl.split(tl.reshape(code, (D // 2, 2)))
            tl.store(Q + page * q_page + off * q_off + tl.arange(0, D // 2), (lo | (hi << 4)).to(tl.int8))
            tl.store(S + page * s_page + off * s_off + tl.arange(0, D // 32), e.to(tl.uint8))
        else:  # FP8: e4m3 + E8M0 per 64 nope dims; the rope dims stay bf16
            g = tl.reshape(y, (D // _KV_BLOCK, _KV_BLOCK))
            s, inv = _pow2_scale(tl.maximum(tl.max(tl.abs(g), axis=1), 1e-4))
            q = _e4m3(tl.reshape(tl.clamp(g * inv[:, None], -448.0, 448.0), (D,)))
            nope = d < NOPE
            tl.store(Q + page * q_page + off * q_off + d, q, mask=nope)
            blk = tl.arange(0, D // _KV_BLOCK)
            sbyte = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)
            tl.store(S + page * s_page + off * s_off + blk, sbyte, mask=blk < NOPE // _KV_BLOCK)
            tl.store(ROPE + page * r_page + off * r_off + d - NOPE, y.to(tl.bfloat16), mask=d >= NOPE)

    @triton.jit
    def _e2m1_value(code):
        """e2m1 codes (int32 0..15) -> fp32 values, as `quant.mxfp4.E2M1_VALUES` (code 8: -0.0)."""
        m = code & 7
        half = 0.5 * (m & 1).to(tl.float32)  # the mantissa bit
        base = tl.where(m < 4, 1.0, tl.where(m < 6, 2.0, 4.0))  # 2^(exponent - 1) for exponents 1..3
        mag = tl.where(m < 2, half, base * (1.0 + half))
        return tl.where(code >= 8, -mag, mag)

    @triton.jit
    def _load_kernel(Q, S, ROPE, PAGE, OFF, OUT, q_page, q_off, s_page, s_off, r_page, r_off, stride_o,
                     D: tl.constexpr, NOPE: tl.constexpr, FP4: tl.constexpr, GP: tl.constexpr, RP: tl.constexpr,
                     TAIL=None, stride_t=0, n_rows=0, HAS_TAIL: tl.constexpr = False, DP: tl.constexpr = 1):
        """Row b of the pool's slots (PAGE, OFF) dequantised; HAS_TAIL: rows from n_rows on copied from TAIL."""
        b = tl.program_id(0)
        if HAS_TAIL:
            if b >= n_rows:  # the chunk's own rows after the window's (`load_rows(tail=)`): no cat
                d = tl.arange(0, DP)
                row = tl.load(TAIL + (b - n_rows).to(tl.int64) * stride_t + d, mask=d < D)
                tl.store(OUT + b.to(tl.int64) * stride_o + d, row, mask=d < D)
            else:
                _load_row(Q, S, ROPE, PAGE, OFF, OUT, q_page, q_off, s_page, s_off, r_page, r_off, stride_o, b, D,
                          NOPE, FP4, GP, RP)
        else:
            _load_row(Q, S, ROPE, PAGE, OFF, OUT, q_page, q_off, s_page, s_off, r_page, r_off, stride_o, b, D, NOPE,
                      FP4, GP, RP)

    @triton.jit
    def _load_row(Q, S, ROPE, PAGE, OFF, OUT, q_page, q_off, s_page, s_off, r_page, r_off, stride_o, b,
                  D: tl.constexpr, NOPE: tl.constexpr, FP4: tl.constexpr, GP: tl.constexpr, RP: tl.constexpr):
        page = tl.load(PAGE + b).to(tl.int64)
        off = tl.load(OFF + b).to(tl.int64)
        out = OUT + b.to(tl.int64) * stride_o
        if FP4:  # packed e2m1 (low nibble: the even element), one E8M0 byte per 32
            j = tl.arange(0, D // 2)
            byte = tl.load(Q + page * q_page + off * q_off + j).to(tl.int32) & 0xFF
            scale = _e8m0_to_f32(tl.load(S + page * s_page + off * s_off + j // 16).to(tl.int32))
            v_lo = _e2m1_value(byte & 0xF) * scale
            v_hi = _e2m1_value(byte >> 4) * scale
            tl.store(out + tl.arange(0, D), tl.reshape(tl.join(v_lo, v_hi), (D,)).to(tl.bfloat16))
        else:  # e4m3 nope dims in blocks of 64 with one E8M0 byte each, then the bf16 rope dims
            g = tl.arange(0, GP)
            e = g[:, None] * _KV_BLOCK + tl.arange(0, _KV_BLOCK)[None, :]
            inb = g < NOPE // _KV_BLOCK
            q = tl.load(Q + page * q_page + off * q_off + e, mask=inb[:, None], other=0.0).to(tl.float32)
            scale = _e8m0_to_f32(tl.load(S + page * s_page + off * s_off + g, mask=inb, other=127).to(tl.int32))
            tl.store(out + e, (q * scale[:, None]).to(tl.bfloat16), mask=inb[:, None])
            r = tl.arange(0, RP)
            rope = tl.load(ROPE + page * r_page + off * r_off + r, mask=r < D - NOPE)
            tl.store(out + NOPE + r, rope.to(tl.bfloat16), mask=r < D - NOPE)


def load_rows_ref(page: torch.Tensor, off: torch.Tensor, pool, tail: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 [B, width]: the rows at (page, off) of an FP8 / FP4 `_EntryPool`, dequantised (its torch `read`);
    tail [T, width] bf16: rows appended after them ([B + T, width])."""
    rows = pool.read(page, off, torch.bfloat16)
    return rows if tail is None else torch.cat((rows, tail))


def load_rows(page: torch.Tensor, off: torch.Tensor, pool, tail: torch.Tensor | None = None) -> torch.Tensor:
    """Triton `load_rows_ref` (FP8 or FP4 pools; page / off 1-D), bit-identical: e4m3 or e2m1 times a power of
    two is exact in bf16. The tail's rows are copied by programs of the same launch."""
    if not (pool.fp8 or pool.fp4) or page.dim() != 1 or off.shape != page.shape:
        raise ValueError(f"load_rows: an FP8 / FP4 pool and 1-D page / off of one length, got fp8={pool.fp8} "
                         f"fp4={pool.fp4}, {tuple(page.shape)} / {tuple(off.shape)}")
    d, b = pool.width, page.shape[0]
    if tail is not None and (tail.dtype != torch.bfloat16 or tail.dim() != 2 or tail.shape[1] != d
                             or tail.stride(1) != 1):
        raise ValueError(f"load_rows: tail must be bf16 [T, {d}] with unit column stride, got {tail.dtype} "
                         f"{tuple(tail.shape)} {tail.stride()}")
    t = 0 if tail is None else tail.shape[0]
    out = torch.empty(b + t, d, dtype=torch.bfloat16, device=pool.q.device)
    if b + t == 0:
        return out
    rope = pool.q if pool.fp4 else pool.rope  # (not read for FP4)
    nope = d if pool.fp4 else pool.nope
    extra = {} if not t else dict(TAIL=tail, stride_t=tail.stride(0), n_rows=b, HAS_TAIL=True,
                                  DP=triton.next_power_of_2(d))
    _load_kernel[(b + t,)](pool.q, pool.s, rope, page, off, out, pool.q.stride(0), pool.q.stride(1), pool.s.stride(0),
                           pool.s.stride(1), rope.stride(0), rope.stride(1), out.stride(0), D=d, NOPE=nope,
                           FP4=pool.fp4, GP=triton.next_power_of_2(max(1, nope // KV_BLOCK)),
                           RP=triton.next_power_of_2(max(1, d - nope)), num_warps=1 if d <= 128 else 2, **extra)
    return out


def pool_windows(rows_c: torch.Tensor, rows_z: torch.Tensor, page: torch.Tensor, slots: torch.Tensor,
                 has_prev: torch.Tensor, ratio: int, dim: int, new_rows: tuple | None = None,
                 store: tuple | None = None, back: int = 0) -> torch.Tensor:
    """Triton `pool_windows_ref` (the new rows, when given, are stored in the same launch). store = (page, off,
    pool, store_rows' keywords): the pooled rows also stored as `store_rows(pooled, page, off, pool, **keywords)`
    stores them, by each row's last-arriving program (the paged decode step's entries: one launch fewer).
    back: how many rows before each may be the same sequence's earlier tokens (an MTP verify step: the pools'
    max_rollback); rows of one sequence are adjacent, in token order, and share `page`."""
    b, r = slots.shape
    overlap = rows_c.shape[-1] == 2 * dim
    out = torch.empty(b, dim, dtype=torch.float32, device=rows_c.device)
    slots = slots.contiguous()
    if new_rows is not None:
        nc, nz, nslot = new_rows
        if nc.shape != (b, rows_c.shape[-1]) or nz.shape != nc.shape or nc.stride() != nz.stride() \
                or nc.stride(-1) != 1 or nc.dtype != rows_c.dtype or nz.dtype != rows_z.dtype:
            raise ValueError(f"pool_windows: new rows must be {rows_c.dtype} [{b}, {rows_c.shape[-1]}] with unit "
                             f"column stride and equal strides, got {nc.dtype} {tuple(nc.shape)} {nc.stride()} / "
                             f"{nz.dtype} {tuple(nz.shape)} {nz.stride()}")
        stride_n = nc.stride(0)
    else:
        nc, nz, nslot, stride_n = rows_c, rows_z, page, 0
    bd = 64 if r > 16 else 128
    _pool_kernel[(b, dim // bd)](rows_c, rows_z, page, slots, has_prev, out, nc, nz, nslot, rows_c.stride(0),
                                 rows_c.stride(1), slots.stride(0), out.stride(0), stride_n, 0, 0, R=r,
                                 RR=triton.next_power_of_2(r), RATIO=ratio, DIM=dim, OVERLAP=overlap, BD=bd,
                                 NEW=new_rows is not None, CHUNK=False, BACK=back if new_rows is not None else 0,
                                 num_warps=4,
                                 **({} if store is None else _store_args(out, *store)))
    return out


def _store_args(out: torch.Tensor, page: torch.Tensor, off: torch.Tensor, pool, kw: dict) -> dict:
    """`_pool_kernel`'s STORE arguments for `pool_windows(store=(page, off, pool, kw))` (kw: store_rows' keywords,
    the norm weight required: the compressors' entries)."""
    b, d = out.shape
    if kw.get("norm_weight") is None or set(kw) - {"norm_weight", "eps", "cos", "sin", "hadamard"}:
        raise ValueError(f"pool_windows: store keywords must be store_rows' with a norm_weight, got {sorted(kw)}")
    q, s, rope, strides, nope = pool_operands(pool, d, "pool_windows")
    cos_t, sin_t, h, stride_cs, consts = _finish_operands(d, out, kw.get("cos"), kw.get("sin"), kw.get("hadamard"))
    return dict(CNT=arrival_counters("pool_windows store", out.device, b), SPAGE=page, SOFF=off,
                W=kw["norm_weight"], COS=cos_t, SIN=sin_t, H=h, SQ=q, SS=s, SR=rope, stride_cs=stride_cs,
                q_page=strides[0], q_off=strides[1], s_page=strides[2], s_off=strides[3], r_page=strides[4],
                r_off=strides[5], eps=float(kw.get("eps", 0.0)), STORE=True, NOPE=nope, FP4=pool.fp4, **consts)


def _check_chunk_operands(c: torch.Tensor, z: torch.Tensor, dim: int, what: str) -> bool:
    """c / z: fp32 [L, dim or 2 * dim] with equal strides and unit column stride. Returns whether they are CSA's
    2 * dim wide rows."""
    overlap = c.shape[-1] == 2 * dim
    if c.dim() != 2 or c.shape[-1] != (2 if overlap else 1) * dim or z.shape != c.shape or c.stride() != z.stride() \
            or c.stride(-1) != 1 or c.dtype != torch.float32 or z.dtype != torch.float32:
        raise ValueError(f"pool_chunk: {what} must be fp32 [L, {dim} or {2 * dim}] with equal strides and unit "
                         f"column stride, got {c.dtype} {tuple(c.shape)} {c.stride()} / {z.dtype} {tuple(z.shape)} "
                         f"{z.stride()}")
    return overlap


def pool_chunk(c: torch.Tensor, z: torch.Tensor, first: int, entry0: int, n: int, ratio: int,
               dim: int, past: tuple | None = None) -> torch.Tensor:
    """Triton `pool_chunk_ref`: one launch, the window rows addressed from the entry index (with `past`, read from
    the ring or c / z: a later prompt chunk's rows are not concatenated onto the state's)."""
    overlap = _check_chunk_operands(c, z, dim, "c / z")
    pc, pz, start, n_past = c, z, 0, 0
    if past is not None:
        pc, pz, start, n_past = past
        if _check_chunk_operands(pc, pz, dim, "past c / z") != overlap or pc.shape[-1] != c.shape[-1] \
                or not 0 <= start < max(pc.shape[0], 1) or not 0 <= n_past <= pc.shape[0]:
            raise ValueError(f"pool_chunk: past ring {tuple(pc.shape)} from row {start}, {n_past} rows, does not "
                             f"match rows {tuple(c.shape)}")
    span = 2 * ratio if overlap else ratio
    if n <= 0:
        return c.new_empty(0, dim)
    _check_chunk_rows(n_past + c.shape[0], first, entry0, n, ratio, overlap)
    out = torch.empty(n, dim, dtype=torch.float32, device=c.device)
    bd = 64 if span > 16 else 128
    _pool_kernel[(n, dim // bd)](c, z, c, c, c, out, pc, pz, c, 0, c.stride(0), 0, out.stride(0), pc.stride(0), first,
                                 entry0, R=span, RR=triton.next_power_of_2(span), RATIO=ratio, DIM=dim,
                                 OVERLAP=overlap, BD=bd, NEW=False, CHUNK=True, n_past=n_past, past_start=start,
                                 past_cap=max(pc.shape[0], 1), PAST=n_past > 0, num_warps=4)
    return out


def store_rows(x: torch.Tensor, page: torch.Tensor, off: torch.Tensor, pool, *, norm_weight=None,
               eps: float = 0.0, cos=None, sin=None, hadamard=None) -> None:
    """Triton `store_rows_ref` (FP8 or FP4 pools)."""
    b, d = x.shape
    x = x.contiguous()
    q, s, rope, strides, nope = pool_operands(pool, d, "store_rows")
    cos_t, sin_t, h, stride_cs, consts = _finish_operands(d, x, cos, sin, hadamard)
    _store_kernel[(b,)](
        x, page, off, norm_weight if norm_weight is not None else x, cos_t, sin_t, h, q, s, rope,
        x.stride(0), stride_cs, *strides, float(eps), D=d, NOPE=nope, NORM=norm_weight is not None, FP4=pool.fp4,
        **consts, num_warps=4)


def _finish_operands(d: int, dummy: torch.Tensor, cos, sin, hadamard) -> tuple:
    """`_finish_store`'s RoPE and Hadamard operands for rows of width d: (cos, sin, Hadamard tensors -- `dummy` where
    absent --, cos / sin's row stride, the constexprs ROPE0, ROT, HADAMARD)."""
    rot = cos is not None
    cos_t, sin_t = (cos.float().contiguous(), sin.float().contiguous()) if rot else (dummy, dummy)
    h = hadamard.float().contiguous() if hadamard is not None else dummy
    return cos_t, sin_t, h, cos_t.stride(0) if rot else 0, dict(ROPE0=d - 2 * cos_t.shape[-1] if rot else d, ROT=rot,
                                                                HADAMARD=hadamard is not None)


def pool_operands(pool, d: int, who: str) -> tuple:
    """`store_row`'s pool operands for rows of width d: (q, s, rope tensors, their 6 page / slot strides, nope),
    or a ValueError naming `who` for a pool the kernel does not write (bf16 storage)."""
    if not (pool.fp8 or pool.fp4):
        raise ValueError(f"{who}: the kernel writes FP8/FP4 pools only (use store_rows_ref)")
    q, s = pool.q, pool.s
    rope = pool.q if pool.fp4 else pool.rope
    strides = (q.stride(0), q.stride(1), s.stride(0), s.stride(1), rope.stride(0), rope.stride(1))
    return q, s, rope, strides, pool.nope if pool.fp8 else d
