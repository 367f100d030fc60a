"""The device-side pieces of the persistent decode GLU / down (`dsv4.kernels.moe_glu_decode`, whose docstring has the
design): the slot's byte views, the work units' enumeration, the activation tiles (and the GLU's finish for them,
FINISH_IN_DOWN), the FP4 widening and the per-column scaling. Apart so that the kernel module stays readable; the
kernels that use them (`_producer`, `_consumer`, `_stream_kernel`) are there."""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON, INTERPRET
from dsv4.kernels.moe_mma_operands import F16_HI_PTX, F16_LO_PTX

U = 2  # K blocks per step (4 columns each of the MMA's 8)

if HAS_TRITON and not INTERPRET:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    from dsv4.kernels.fp8_linear import _e4m3, _pow2_scale

    _LO_ASM = gl.constexpr(F16_LO_PTX)
    _HI_ASM = gl.constexpr(F16_HI_PTX)

    @gluon.constexpr_function
    def mma_byte_view():
        """The [64 rows, 64 bytes] slot of one K block (TMA, 64-byte swizzle: 16-byte chunk c of row r at c ^
        ((r >> 1) & 3)) as uint8 [64, 64] indexed by (row, K index of `_mma_order`: k = 16c + 8h + 2t + i <->
        byte 32h + 8t + 2c + i). A shared linear layout lists, per bit of the byte offset, the (row, k) stored
        there: offset bits 0-5 are the row's byte bits (i, c0, c1, t0, t1, h), bit 6 row 1; bits 7 and 8 (rows
        2 and 4) carry the swizzle: offset 128 holds row 2's chunk 1 (t1, k = 4), offset 256 row 4's chunk 2
        (h, k = 8); bits 9-11 rows 8, 16, 32."""
        return gl.SharedLinearLayout(offset_bases=[[0, 1], [0, 16], [0, 32], [0, 2], [0, 4], [0, 8], [1, 0],
                                                   [2, 4], [4, 8], [8, 0], [16, 0], [32, 0]])

    @gluon.constexpr_function
    def mma_byte_regs():
        """uint8 [64, 64] (row, k) with the wgmma A operand's lanes and warps (16-bit, k_width 2: rows lane // 4
        + 16 warp, k = 2 (lane % 4)), its registers ordered i, c0, c1 (8 contiguous bytes: one 64-bit load), h,
        row + 8 -- the A operand layout up to register order."""
        return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 16], [0, 32], [0, 8], [8, 0]],
                                          lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
                                          warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 64])

    @gluon.constexpr_function
    def _matrices(glu):
        """Weight matrices per unit, i.e. [64, 64]-byte weight boxes per K block of a ring slot: gate and up (the
        GLU), or W2's rows (the down)."""
        return 2 if glu else 1

    @gluon.jit
    def _unit_count(n_units, n_per, S: gl.constexpr, CONTIG: gl.constexpr, RUN: gl.constexpr):
        """How many work units this program takes: every num_programs-th (strided), or (CONTIG) a run of n_per of
        its K range's (pair, row tile) units."""
        pid = gl.program_id(0)
        if CONTIG:
            return gl.maximum(gl.minimum(n_per, n_units // S - (pid // S) * n_per), 0)
        elif RUN == 1:
            return (n_units - pid + gl.num_programs(0) - 1) // gl.num_programs(0)
        else:
            return (n_units // RUN - pid + gl.num_programs(0) - 1) // gl.num_programs(0) * RUN

    @gluon.jit
    def _unit(k, n_per, T: gl.constexpr, S: gl.constexpr, CONTIG: gl.constexpr, RUN: gl.constexpr):
        """(pair, row tile, K range) of this program's k-th unit. Strided: unit pid + k num_programs, K range
        fastest (num_programs a multiple of S: a program keeps one K range); with RUN > 1 runs of RUN row tiles of
        one pair and K range are strided so (run pid + (k // RUN) num_programs, its tile k % RUN), so a program
        builds a token's activation tiles once per run, not once per unit. CONTIG: K range pid % S, (pair, tile)
        units (pid // S) n_per + k, tile fastest -- a program keeps its pair over many units (the down GEMV, whose
        activation tiles are the pair's own)."""
        pid = gl.program_id(0)
        if CONTIG:
            j = (pid // S) * n_per + k
            return j // T, j % T, pid % S
        elif RUN == 1:
            q = pid + k * gl.num_programs(0)
            return q // (T * S), (q // S) % T, q % S
        else:
            run = pid + (k // RUN) * gl.num_programs(0)
            rem = run % (S * (T // RUN))
            return run // (S * (T // RUN)), (rem // S) * RUN + k % RUN, rem % S

    @gluon.jit
    def _build_b(b_s, XQ, t, stride_x, kb0, KBR: gl.constexpr, HALF: gl.constexpr, NCONS: gl.constexpr):
        """The block-diagonal activation tiles of token t's K blocks kb0 .. kb0 + KBR - 1: tile 2j + h ([8 columns,
        64 k], the wgmma B operand transposed) holds the low (h 0) / high (h 1) nibbles' activations of block j in
        column 4 (j % 2) + 2 ((k // 8) % 2) + h, zero elsewhere (`moe_mma_operands._act_tiles`); only the tiles of
        consumer HALF's steps (of NCONS; step s: tiles 4s .. 4s + 3). Their activations are loaded in one go (the
        tile-by-tile loads were a chain of L2 round trips at the kernel's start: 14 % of its stall samples, s48),
        each tile then picked out of the registers (a sum over the thread's own rows) and stored."""
        NQ: gl.constexpr = 4 * (KBR // 2 // NCONS)  # this consumer's tiles
        l3: gl.constexpr = gl.BlockedLayout([NQ, 1, 4], [1, 2, 16], [1, 4, 1], [2, 1, 0])  # [tile, column, k]
        x_l: gl.constexpr = gl.SliceLayout(1, l3)
        q = gl.arange(0, NQ, layout=gl.SliceLayout(1, x_l))
        k = gl.arange(0, 64, layout=gl.SliceLayout(0, x_l))
        tile = 4 * (HALF + NCONS * (q // 4)) + q % 4
        x = gl.load(XQ + t.to(gl.int64) * stride_x + kb0 * 128 + 64 * tile[:, None] + k[None, :])
        col = 4 * ((tile % 4) // 2)[:, None] + 2 * ((k // 8) % 2)[None, :] + (tile % 2)[:, None]
        n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, l3)))
        tiles = gl.where(n[None, :, None] == gl.expand_dims(col, 1), gl.expand_dims(x, 1), 0.0)
        q3 = gl.expand_dims(gl.expand_dims(q, 1), 1)
        for i in gl.static_range(NQ):
            b_s.index(4 * (HALF + NCONS * (i // 4)) + i % 4).store(gl.sum(gl.where(q3 == i, tiles, 0.0), axis=0))

    @gluon.jit
    def _finish_blocks(ZQ, ZS, FIN, TOPK_W, p, stride_zq, stride_zs, stride_fs, stride_fp, I, limit, kb0,
                       KBR: gl.constexpr, HALF: gl.constexpr, NCONS: gl.constexpr, NR: gl.constexpr):
        """The GLU's finish (`moe_glu_decode._finish_kernel`: the NR fp32 partials FIN [NR, pairs, 2I] summed in range
        order from 0.0, `moe_mma_operands._glu_out`'s epilogue, `_quant_rows`) for the K blocks of pair p that
        consumer HALF's steps read, stored to z's codes ZQ / scales ZS as the finish stores them (FINISH_IN_DOWN).
        Each value is computed where it is stored (`_act_pos` inverted), 8 per thread: [block, half, k]."""
        NB: gl.constexpr = KBR // NCONS  # this consumer's K blocks (2 per step)
        l3: gl.constexpr = gl.BlockedLayout([NB // 4, 1, 4], [1, 2, 16], [4, 1, 1], [2, 1, 0])
        b = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, l3)))
        h = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, l3)))
        k = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, l3)))
        kb = kb0 + 2 * (HALF + NCONS * (b // 2)) + b % 2  # (step s's blocks: 2s, 2s + 1)
        pos = 64 * h[None, :, None] + k[None, None, :]
        ch = 64 * ((pos // 8) % 2) + 32 * (pos // 64) + 8 * ((pos // 2) % 4) + 2 * ((pos // 16) % 4) + pos % 2
        src = FIN + p.to(gl.int64) * stride_fp + kb[:, None, None] * 128 + ch
        gate = gl.zeros([NB, 2, 64], gl.float32, layout=l3)
        up = gl.zeros([NB, 2, 64], gl.float32, layout=l3)
        for r in gl.static_range(NR):
            gate += gl.load(src + r * stride_fs)
            up += gl.load(src + r * stride_fs + I)
        g = gl.minimum(gate.to(gl.bfloat16).to(gl.float32), limit)
        u = gl.minimum(gl.maximum(up.to(gl.bfloat16).to(gl.float32), -limit), limit)
        z = ((g / (1.0 + gl.exp(-g)) * u) * gl.load(TOPK_W + p)).to(gl.bfloat16).to(gl.float32)
        sc, inv = _pow2_scale(gl.maximum(gl.max(gl.max(gl.abs(z), axis=2), axis=1), 1e-4))
        q = _e4m3(gl.minimum(gl.maximum(z * inv[:, None, None], -448.0), 448.0))
        gl.store(ZQ + p.to(gl.int64) * stride_zq + kb[:, None, None] * 128 + pos, q.to(gl.float16))
        gl.store(ZS + p.to(gl.int64) * stride_zs + kb, sc)

    @gluon.jit
    def _widen(w_s, i, a_l: gl.constexpr):
        """Slot buffer i's bytes -> the f16 wgmma A operands (low nibbles, high nibbles) of its K block."""
        b = w_s.index(i)._reinterpret(gl.uint8, [64, 64], mma_byte_view()).load(mma_byte_regs())
        lo = gl.inline_asm_elementwise(_LO_ASM, "=r,=r,r", [b], dtype=gl.float16, is_pure=True, pack=4)
        hi = gl.inline_asm_elementwise(_HI_ASM, "=r,=r,r", [b], dtype=gl.float16, is_pure=True, pack=4)
        return gl.convert_layout(lo, a_l), gl.convert_layout(hi, a_l)

    @gluon.jit
    def _step_scales(sc_s, i, step, acc_l: gl.constexpr):
        """Scale buffer i's bytes of this step ([64, 8] of its 16-byte run: the first or second half)."""
        if step % 2 == 0:
            return sc_s.index(i).slice(0, 8, dim=1).load(acc_l)
        else:
            return sc_s.index(i).slice(8, 8, dim=1).load(acc_l)

    @gluon.jit
    def _scaled(acc, part, sc, sa):
        """acc + part * 2^(b - 127 + 6) * sa per column (`moe_mma_operands._scale_acc`, the same order)."""
        f = ((sc.to(gl.int32) + 6) << 23).to(gl.float32, bitcast=True)
        return acc + (part * f) * sa[None, :]
