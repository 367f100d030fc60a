"""Prefill attention of one sequence's chunk (spec §2.5), beside a torch reference of the same signature.

Query i of the chunk sits at position t = q_pos0 + i and attends, in one softmax with the per-head
sink logit, to

* the window: keys at positions max(0, t-W+1) .. t, row j of `keys` holding position key_pos0 + j
  (the previous window followed by the chunk's own kv, consecutive positions);
* compressed entries: the rows `entry_idx[i]` of `entries` (-1 = none): the indexer's top-k on CSA
  layers, every complete entry on HCA layers.

K = V (one shared kv head, MQA). Scores `q.k * scale` in fp32; probabilities rounded to bf16 for P.V
with fp32 accumulation; the denominator sums the unrounded probabilities plus exp(sink). The output is
bf16; with cos / sin given, its rope pairs are then rotated back by -t (the inverse RoPE, on the bf16-rounded
output in fp32 as `dsv4.kernels.norm_rope(inverse=True)` does, so the same bits as that second launch);
without them the caller's `finish` applies it.

Kernel: grid (queries, Dh / DV); a program holds all heads of one query (the heads share every key
tile) and walks its window tiles, then its gathered entries, in tiles of BN keys with an online
softmax. Scores need the whole head dim, so with DV < Dh (Pro's 128 heads) the programs of one query
recompute them and each keeps a DV-wide slice of the output (fewer live registers). The running
maximum differs from the reference's single maximum only in where the bf16 rounding of the
probabilities happens.
"""

from __future__ import annotations

import torch

from dsv4.kernels import prefill_attention_gluon
from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton  # noqa: F401
from dsv4.kernels._triton import rotate_pairs

# K = V (one shared kv head): with the whole head dim in one program the value tile is the key tile already
# loaded, so skip its second load (same values; frees shared memory for 64-key tiles: 197 -> 131 KB).
# H200, Flash 8K, s10b: with 64-key tiles CSA 4.81 -> 3.49 ms, HCA 1.55 -> 1.20, SWA 1.02 -> 0.81
KV_ONE_LOAD = True
# The kernel is issue-bound: 1,020 (window) / 1,393 (gathered entries) SASS instructions per 64-key tile and
# thread, 87 of them spill traffic in the entries loop (255 registers), against ≈ 36 wgmmas per warpgroup.
# UNMASKED_LOADS: key rows past the window's end or of -1 entry slots are read from a valid row (the last window
# row / entry 0) instead of masked, their scores still -inf: no per-load predicates, the same output bits (entries
# loop 1,265 instructions). H200 s30b, Flash 8K, ms per layer: masked CSA 3.45, HCA 1.18, SWA 0.80; unmasked 3.34,
# 1.18, 0.79. Measured and removed: a lazy rescale of the accumulator (only when a row's maximum grew by more than
# a margin) 3.56, 1.31, 0.98 (the branch costs more than the 128 multiplies per tile it saves); 128-key tiles on
# one stage (s30e; 1,163 instructions per 64 keys but 1.8 KB spilled) CSA 4.64, HCA 2.09, SWA 0.82.
UNMASKED_LOADS = True
# Up to 64 heads with the default knobs: the Gluon kernel (`prefill_attention_gluon`: asynchronous wgmmas, the next
# tile's copy and MMAs overlapping the softmax, N split between two warpgroups). H200 s34c, Flash 8K, ms per layer,
# this kernel -> Gluon: CSA 3.34 -> 2.37, HCA 1.19 -> 0.84, SWA 0.79 -> 0.61; 8-layer 8K prefill 102 -> 98 ms.
# Its final loop (s34e): CSA 2.20, HCA 0.78, SWA 0.56.
GLUON = True


def prefill_attention_ref(q: torch.Tensor, q_pos0: int, keys: torch.Tensor, key_pos0: int, window: int,
                          entries: torch.Tensor | None, entry_idx: torch.Tensor | None, sink: torch.Tensor,
                          scale: float, cos: torch.Tensor | None = None,
                          sin: torch.Tensor | None = None) -> torch.Tensor:
    """Reference: the entry lists as a mask, then the model's `sink_attention` (its own arithmetic), then the
    model's inverse RoPE when cos / sin [n, rope/2] are given."""
    from dsv4.model.indexer import indices_to_mask
    from dsv4.model.rope import apply_rope
    from dsv4.model.sink_attention import sink_attention

    n, dev = q.shape[0], q.device
    q_pos = torch.arange(q_pos0, q_pos0 + n, device=dev)
    key_pos = torch.arange(key_pos0, key_pos0 + keys.shape[0], device=dev)
    mask = None if entries is None else indices_to_mask(entry_idx, entries.shape[0])
    out = sink_attention(q, q_pos, keys, key_pos, window, entries, mask, sink.float(), scale,
                         first=(q_pos0, key_pos0))
    return out if cos is None else apply_rope(out, cos.float()[:, None], -sin.float()[:, None])


if HAS_TRITON:

    @triton.jit
    def _dot(a, b, INTERP: tl.constexpr):
        if INTERP:  # Triton's interpreter multiplies raw bf16 bits in `dot`
            return tl.dot(a.to(tl.float32), b.to(tl.float32))
        return tl.dot(a, b)

    @triton.jit
    def _softmax_step(m, l, acc, s, v, INTERP: tl.constexpr):
        """One online-softmax step over a key tile: s [BH, BN] fp32 scores (-inf masked), v [BN, DV]."""
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _dot(p.to(tl.bfloat16), v, INTERP)
        return m_new, l, acc

    @triton.jit
    def _prefill_attn_kernel(
        Q, K, E, IDX, SINK, OUT, COS, SIN,
        H, n_idx, q_pos0, key_pos0, window, scale,
        stride_qt, stride_qh, stride_kt, stride_et, stride_it, stride_ot, stride_oh, stride_ct,
        BH: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BN: tl.constexpr, HAS_E: tl.constexpr,
        INTERP: tl.constexpr, KV_ONE_LOAD: tl.constexpr, ROT: tl.constexpr, NOPE: tl.constexpr,
        UNMASKED: tl.constexpr = False,
        CAUSAL_R: tl.constexpr = 0,
    ):
        t = tl.program_id(0)
        offs_h = tl.arange(0, BH)
        hmask = offs_h < H
        offs_d = tl.arange(0, D)
        offs_v = tl.program_id(1) * DV + tl.arange(0, DV)
        offs_n = tl.arange(0, BN)
        q = tl.load(Q + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
                    mask=hmask[:, None], other=0.0)
        m = tl.full((BH,), -1.0e30, dtype=tl.float32)
        l = tl.zeros((BH,), dtype=tl.float32)
        acc = tl.zeros((BH, DV), dtype=tl.float32)

        pos = q_pos0 + t
        j_lo = tl.maximum(pos - window + 1 - key_pos0, 0)
        j_hi = pos - key_pos0 + 1  # exclusive: the query's own key is the last one
        for j0 in range(j_lo, j_hi, BN):
            rows = j0 + offs_n
            valid = rows < j_hi
            if UNMASKED:
                base = K + tl.minimum(rows, j_hi - 1).to(tl.int64)[:, None] * stride_kt
                k = tl.load(base + offs_d[None, :])
            else:
                base = K + rows.to(tl.int64)[:, None] * stride_kt
                k = tl.load(base + offs_d[None, :], mask=valid[:, None], other=0.0)
            s = _dot(q, tl.trans(k), INTERP) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            v = k if KV_ONE_LOAD else tl.load(base + offs_v[None, :], mask=valid[:, None], other=0.0)
            m, l, acc = _softmax_step(m, l, acc, s, v, INTERP)
        if HAS_E:
            # CAUSAL_R (HCA): every complete entry, (pos + 1) // CAUSAL_R of the n_idx, in order: the list's tiles
            n_list = tl.minimum((pos + 1) // CAUSAL_R, n_idx) if CAUSAL_R > 0 else n_idx
            for i0 in range(0, n_list, BN):
                slot = i0 + offs_n
                if CAUSAL_R > 0:
                    idx = tl.where(slot < n_list, slot, -1)
                else:
                    idx = tl.load(IDX + t.to(tl.int64) * stride_it + slot, mask=slot < n_idx, other=-1)
                valid = idx >= 0
                base = E + tl.where(valid, idx, 0).to(tl.int64)[:, None] * stride_et
                if UNMASKED:  # (entry 0 exists whenever the list is not empty)
                    k = tl.load(base + offs_d[None, :])
                else:
                    k = tl.load(base + offs_d[None, :], mask=valid[:, None], other=0.0)
                s = _dot(q, tl.trans(k), INTERP) * scale
                s = tl.where(valid[None, :], s, float("-inf"))
                v = k if KV_ONE_LOAD else tl.load(base + offs_v[None, :], mask=valid[:, None], other=0.0)
                m, l, acc = _softmax_step(m, l, acc, s, v, INTERP)

        sink = tl.load(SINK + offs_h, mask=hmask, other=0.0)
        o = acc / (l + tl.exp(sink - m))[:, None]
        if ROT:  # the inverse RoPE on the bf16 output; pairs (2i, 2i+1) lie in one slice (DV even)
            o = o.to(tl.bfloat16).to(tl.float32)
            ev, od = tl.split(tl.reshape(o, (BH, DV // 2, 2)))
            pair = tl.program_id(1) * (DV // 2) + tl.arange(0, DV // 2)
            rp = pair >= NOPE // 2
            c = tl.load(COS + t.to(tl.int64) * stride_ct + (pair - NOPE // 2), mask=rp, other=1.0)[None, :]
            sn = -tl.load(SIN + t.to(tl.int64) * stride_ct + (pair - NOPE // 2), mask=rp, other=0.0)[None, :]
            o = tl.reshape(tl.join(*rotate_pairs(ev, od, c, sn)), (BH, DV))  # norm_rope(inverse=True)'s bits
        tl.store(OUT + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh + offs_v[None, :],
                 o.to(OUT.dtype.element_ty), mask=hmask[:, None])


def prefill_attention(q: torch.Tensor, q_pos0: int, keys: torch.Tensor, key_pos0: int, window: int,
                      entries: torch.Tensor | None, entry_idx: torch.Tensor | None, sink: torch.Tensor,
                      scale: float, cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
                      out: torch.Tensor | None = None, dv: int | None = None, bn: int | None = None,
                      num_warps: int | None = None, num_stages: int | None = None,
                      causal_ratio: int = 0, q_norm: tuple | None = None) -> torch.Tensor:
    """Triton version of `prefill_attention_ref` (bf16 q/keys/entries, int entry_idx [n, k], cos / sin
    [n, rope/2] for the inverse RoPE or neither); fills `out`. causal_ratio r > 0 with entry_idx None: every
    complete entry, (t + 1) // r of them for the query at t (HCA), the list not built; the same bits as that
    list. dv / bn / num_warps / num_stages: the output slice per program, keys per tile and the launch shape
    (defaults: the measured ones). q_norm = (eps, cos, sin): q is before its per-head norm + RoPE (`norm_rope`
    UNWEIGHTED with these; cos / sin [n, rope/2]), which the Gluon kernel applies to Q in shared memory; other
    paths call `norm_rope` first."""
    n, h, d = q.shape
    if q_norm is not None and (len(q_norm) != 3 or q_norm[1].shape != (n, q_norm[1].shape[-1])
                               or q_norm[2].shape != q_norm[1].shape or not 0 < 2 * q_norm[1].shape[-1] <= d):
        raise ValueError(f"prefill_attention: q_norm must be (eps, cos, sin) with cos / sin [n={n}, rope/2 <= "
                         f"{d // 2}]")
    rot = cos is not None
    if (sin is not None) != rot or (rot and (cos.dim() != 2 or cos.shape[0] != n or sin.shape != cos.shape
                                            or not 0 < 2 * cos.shape[1] <= d)):
        raise ValueError(f"prefill_attention: cos / sin must both be [n={n}, rope/2 <= {d // 2}] or both None, got "
                         f"{None if cos is None else tuple(cos.shape)} / {None if sin is None else tuple(sin.shape)}")
    if q.dtype != torch.bfloat16 or keys.dtype != torch.bfloat16 or keys.shape[1] != d:
        raise ValueError(f"prefill_attention: expected bf16 q [n, H, {d}] and keys [K, {d}], got "
                         f"{q.dtype} {tuple(q.shape)} / {keys.dtype} {tuple(keys.shape)}")
    if q_pos0 < key_pos0 or q_pos0 + n > key_pos0 + keys.shape[0]:
        raise ValueError(f"prefill_attention: keys [{key_pos0}, {key_pos0 + keys.shape[0]}) must hold the "
                         f"queries' own positions [{q_pos0}, {q_pos0 + n})")
    causal = causal_ratio > 0 and entry_idx is None and entries is not None
    if causal_ratio < 0 or (causal_ratio and entry_idx is not None):
        raise ValueError(f"prefill_attention: causal_ratio {causal_ratio} must be > 0 and comes instead of entry_idx")
    if causal and (entries.dtype != torch.bfloat16 or entries.shape[1] != d):
        raise ValueError(f"prefill_attention: entries {entries.dtype} {tuple(entries.shape)} do not match q "
                         f"{tuple(q.shape)}")
    has_e = entries is not None and entries.shape[0] > 0 and (causal or (entry_idx is not None and
                                                                        entry_idx.shape[1] > 0))
    if has_e and not causal and (entries.dtype != torch.bfloat16 or entries.shape[1] != d or entry_idx.shape[0] != n):
        raise ValueError(f"prefill_attention: entries {entries.dtype} {tuple(entries.shape)} / entry_idx "
                         f"{tuple(entry_idx.shape)} do not match q {tuple(q.shape)}")
    out = torch.empty_like(q) if out is None else out
    if n == 0:
        return out
    gluon = GLUON and not INTERPRET and prefill_attention_gluon.supports(q, dv, bn, num_warps, num_stages)
    if q_norm is not None and not (gluon and prefill_attention_gluon.supports_q_norm(d, 2 * q_norm[1].shape[-1])):
        from dsv4.kernels.norm_rope import UNWEIGHTED, norm_rope
        q, q_norm = norm_rope(q, norm=UNWEIGHTED, eps=q_norm[0], cos=q_norm[1], sin=q_norm[2]), None
    bh = max(16, triton.next_power_of_2(h))
    # the whole head dim per program up to 64 heads x 512 (H200, Flash 8K, s9f: CSA 7.16 -> 4.81 ms, HCA 2.52 ->
    # 1.54, SWA 1.74 -> 1.02 against two half-width programs that each recompute the scores); Pro's 128 heads
    # would need 256 accumulator registers per thread, so they keep the split
    dv = dv or (d if bh * d <= 64 * 512 else d // 2)
    one_load = KV_ONE_LOAD and dv == d
    bn = bn or (64 if one_load else 32)  # 64-key tiles fit in shared memory only with the one load
    e = entries if has_e else keys
    idx = entry_idx.to(torch.int32).contiguous() if has_e and not causal else keys
    q, keys, e = q.contiguous(), keys.contiguous(), e.contiguous()
    sink = sink.float().contiguous()
    if gluon:
        rope = (cos.float().contiguous(), sin.float().contiguous()) if rot else (None, None)
        prefill_attention_gluon.prefill_attention_gluon(q, q_pos0, keys, key_pos0, window, e if has_e else None,
                                                        idx if has_e and not causal else None, sink, scale, *rope,
                                                        out, causal_ratio if causal else 0, has_e,
                                                        q_norm=None if q_norm is None else (
                                                            q_norm[0], q_norm[1].float().contiguous(),
                                                            q_norm[2].float().contiguous()))
        return out
    cos, sin = (cos.float().contiguous(), sin.float().contiguous()) if rot else (sink, sink)  # unread if not rot
    _prefill_attn_kernel[(n, d // dv)](
        q, keys, e, idx, sink, out, cos, sin,
        h, (e.shape[0] if causal else idx.shape[1]) if has_e else 0, q_pos0, key_pos0, window, float(scale),
        q.stride(0), q.stride(1), keys.stride(0), e.stride(0), idx.stride(0) if has_e and not causal else 0,
        out.stride(0), out.stride(1), cos.stride(0) if rot else 0,
        BH=bh, D=d, DV=dv, BN=bn, HAS_E=has_e, INTERP=INTERPRET, KV_ONE_LOAD=one_load, ROT=rot,
        NOPE=d - 2 * cos.shape[1] if rot else d, UNMASKED=UNMASKED_LOADS,
        CAUSAL_R=causal_ratio if causal else 0,
        num_warps=num_warps or (8 if bh * dv >= 16384 else 4),
        # 128 heads x 512 dims: two stages would not fit in shared memory
        num_stages=num_stages or (2 if bh <= 64 else 1),
    )
    return out
