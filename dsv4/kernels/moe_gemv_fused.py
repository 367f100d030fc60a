"""Launch fusions of the decode routed MoE (method "mma" of dsv4.kernels.moe_gemv): the last program to finish a
piece of work that spans several programs does the follow-up kernel's work for that piece, so that launch goes.
Same bits as the separate launches: the same loads, the same fp32 math in the same order.

z re-quantisation (`moe_gemv.FUSE_Z_QUANT`, GLU tiles of BN = 64 < the 128-wide quantisation block): a program
that has its tile's final z (the split-K last arriver, or the program itself unsplit) stores it as bf16 and
arrives on a counter per (pair, 128-block); the second of the block's two tiles reads the 128 bf16 values back
and quantises them as `moe_gemv._quant16_kernel` does (`_quant_z_block`). Replaces that kernel's launch.

Combine (`moe_gemv.FUSE_COMBINE`): a down program that has its (pair, column tile)'s final y stores it as bf16
and arrives on a counter per (token, column tile), expecting one arrival per slot of the token whose expert is
in [0, E) (this rank's pairs); the last one sums the token's slots in slot order 0..top_k-1 (other ranks'
slots add 0.0) plus the shared expert row, as `moe._moe_combine_kernel` does, and writes `out`
(`_combine_tile`). A token with no slot on this rank gets its row (0.0 [+ shared]) from the program of its
slot 0 (`_combine_no_slots`). Replaces the combine launch; the shared expert's join moves before the down launch.

x quantisation (`moe_gemv.FUSE_X_QUANT`, opt-in): the GLU reads bf16 x and quantises each 128-block of its K
range in its activation loads (`_act_tiles_q`): amax, power-of-two scale and e4m3 codes of `_quant_rows`, so
the same codes and scales as `_quant16_kernel`; every program of a token recomputes them (a few hundred
element operations per block beside 2 x BN x 64 weight bytes). Replaces the x-quantisation launch.

Counters (`dsv4.kernels._triton.arrival_counters`): reset to 0 by the last arriver, ordering as in
`moe_gemv._arrive` (barrier, gpu-scope acq_rel atomic, barrier, `.cg` loads of the other programs' stores).
"""

from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    from dsv4.kernels.fp8_linear import _pow2_scale, _quant_rows

    @triton.jit
    def _act_pos(e):
        """Stored position of element e (0..127) of a 128-block of MMA activations: the low-nibble tile's
        elements (groups 0, 2) at 0..63, the high one's (groups 1, 3) at 64..127, each in the K order of
        `_mma_order` (byte 32h + 8t + 2c + i at 16c + 8h + 2t + i)."""
        tile = (e // 32) % 2
        h = e // 64
        t = (e // 8) % 4
        c = (e // 2) % 4
        return 64 * tile + 16 * c + 8 * h + 2 * t + e % 2

    @triton.jit
    def _act_elem(k):
        """Inverse of `_act_pos`: the element (0..127) stored at position k of a 128-block."""
        tile = k // 64
        c = (k // 16) % 4
        h = (k // 8) % 2
        t = (k // 2) % 4
        byte = 32 * h + 8 * t + 2 * c + k % 2
        return byte + 32 * (byte >= 32).to(tl.int32) + 32 * tile

    @triton.jit
    def _arrive_n(CNT, idx, expected):
        """Bump counter idx after this program's stores; True in the `expected`-th arriver only (the
        release / acquire of `moe_gemv._arrive`)."""
        tl.debug_barrier()
        arrived = tl.atomic_add(CNT + idx, 1, sem="acq_rel", scope="gpu")
        last = arrived == expected - 1  # uniform over the CTA: the atomic's result is broadcast
        if last:
            tl.debug_barrier()
        return last

    @triton.jit
    def _quant_z_block(Z, ZQ, ZS, QCNT, p, pid_n, I, stride_z, stride_zq, stride_zs, BN: tl.constexpr):
        """After this tile's bf16 z store: the last of the 128 // BN tiles of its 128-block quantises the
        block (`_quant16_kernel`'s loads and math) and resets the block's counter."""
        TILES: tl.constexpr = 128 // BN
        kb = pid_n // TILES
        idx = p * (I // 128) + kb
        if _arrive_n(QCNT, idx, TILES):
            offs = tl.arange(0, 128)
            z = tl.load(Z + p * stride_z + kb * 128 + offs, cache_modifier=".cg")
            q, s = _quant_rows(z[None, :].to(tl.float32))
            tl.store(ZQ + p * stride_zq + kb * 128 + _act_pos(offs)[None, :], q.to(tl.float16))
            tl.store(ZS + p * stride_zs + kb + tl.arange(0, 1), s)
            tl.store(QCNT + idx, 0)  # both tiles have arrived: ready for the next launch / replay

    @triton.jit
    def _token_slots(IDS, t, top_k, num_experts):
        """Number of token t's slots whose expert is this rank's (in [0, E))."""
        valid = 0
        for j in range(top_k):
            e = tl.load(IDS + t * top_k + j)
            valid += ((e >= 0) & (e < num_experts)).to(tl.int32)
        return valid

    @triton.jit
    def _combine_store(Y, SH, OUT, IDS, t, offs_n, top_k, num_experts, stride_y, stride_sh, stride_out,
                       BN: tl.constexpr, HAS_SHARED: tl.constexpr):
        """out[t, offs_n] = fp32 sum over t's slots in order (another rank's slot adds 0.0, as in
        `_moe_combine_kernel`) [+ shared], rounded to OUT's dtype."""
        acc = tl.zeros((BN,), dtype=tl.float32)
        for j in range(top_k):
            e = tl.load(IDS + t * top_k + j)
            here = (e >= 0) & (e < num_experts)
            acc += tl.load(Y + (t * top_k + j) * stride_y + offs_n, mask=here, other=0.0,
                           cache_modifier=".cg").to(tl.float32)
        if HAS_SHARED:
            acc += tl.load(SH + t * stride_sh + offs_n).to(tl.float32)
        tl.store(OUT + t * stride_out + offs_n, acc.to(OUT.dtype.element_ty))

    @triton.jit
    def _combine_tile(Y, SH, OUT, IDS, TCNT, p, offs_n, top_k, num_experts, stride_y, stride_sh, stride_out,
                      BN: tl.constexpr, HAS_SHARED: tl.constexpr):
        """After this pair's bf16 y tile store: the token's last arriving pair for this column tile writes
        the token's combine for the tile and resets the tile's counter."""
        t = p // top_k
        idx = t * tl.num_programs(1) + tl.program_id(1)
        if _arrive_n(TCNT, idx, _token_slots(IDS, t, top_k, num_experts)):
            _combine_store(Y, SH, OUT, IDS, t, offs_n, top_k, num_experts, stride_y, stride_sh, stride_out, BN,
                           HAS_SHARED)
            tl.store(TCNT + idx, 0)

    @triton.jit
    def _combine_no_slots(Y, SH, OUT, IDS, p, top_k, num_experts, stride_y, stride_sh, stride_out,
                          BN: tl.constexpr, HAS_SHARED: tl.constexpr):
        """A pair of another rank: if it is slot 0 of a token none of whose slots is this rank's (so no pair
        arrives), its first split's program writes the token's combine for the tile (0.0 [+ shared])."""
        t = p // top_k
        if (p % top_k == 0) & (tl.program_id(2) == 0):
            if _token_slots(IDS, t, top_k, num_experts) == 0:
                offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
                _combine_store(Y, SH, OUT, IDS, t, offs_n, top_k, num_experts, stride_y, stride_sh, stride_out,
                               BN, HAS_SHARED)

    @triton.jit
    def _act_tiles_q(Xrow, kb, u0: tl.constexpr, KD: tl.constexpr):
        """`moe_mma_operands._act_tiles` from bf16 x: K blocks kb .. kb+KD-1 quantised here (`_quant_rows`' amax,
        scale and e4m3 codes, as f16), and their scales [16] (column 4u + g: block u's scale)."""
        k = tl.arange(0, 64 * KD)
        n = tl.arange(0, 16)
        col = 4 * (u0 + k // 64) + 2 * ((k // 8) % 2)
        elem = Xrow + kb * 128 + (k // 64) * 128 + _act_elem(k % 64)
        x_lo = tl.load(elem[:, None] + n[None, :] * 0, mask=n[None, :] == col[:, None], other=0.0).to(tl.float32)
        x_hi = tl.load(elem[:, None] + 32 + n[None, :] * 0, mask=n[None, :] == col[:, None] + 1,
                       other=0.0).to(tl.float32)
        # amax of block u: over its 4 columns 4u .. 4u+3 of both tiles (the masked zeros change no max)
        cmax = tl.maximum(tl.max(tl.abs(x_lo), axis=0), tl.max(tl.abs(x_hi), axis=0))
        bmax = tl.max(tl.where((n[:, None] // 4) == (n[None, :] // 4), cmax[None, :], 0.0), axis=1)
        s, inv = _pow2_scale(tl.maximum(bmax, 1e-4))
        lo = tl.clamp(x_lo * inv[None, :], -448.0, 448.0).to(tl.float8e4nv).to(tl.float16)
        hi = tl.clamp(x_hi * inv[None, :], -448.0, 448.0).to(tl.float8e4nv).to(tl.float16)
        return lo, hi, s
