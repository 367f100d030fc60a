"""The device-side pieces of the persistent decode GLU / down (`dsv4.kernels.moe_glu_decode`, whose docstring has the
design): the slot's byte views, the work units' enumeration, the
activation tiles, the FP4 widening and the per-column scaling. Apart so that the kernel module stays readable; the
kernels that use them (`_producer`, `_consumer`, `_stream_kernel`) are there; the GLU's finish launch
(`_finish_kernel`) and the chained kernel's signal warp are here too."""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON, INTERPRET
from dsv4.kernels.moe_mma_operands import F16_HI_PTX, F16_LO_PTX

U = 2  # K blocks per step (4 columns each of the MMA's 8)

if HAS_TRITON and not INTERPRET:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier

    import triton
    import triton.language as tl

    from dsv4.kernels._triton import pdl_kernel, pdl_wait
    from dsv4.kernels.fp8_linear import _quant_rows
    from dsv4.kernels.moe_mma_operands import _act_pos, _glu_out, _swiglu_z

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
    def _build_b(b_s, XQ, t, stride_x, kb0, KBR: gl.constexpr, HALF: gl.constexpr, NCONS: gl.constexpr,
                 CG: gl.constexpr = False):
        """The block-diagonal activation tiles of token t's K blocks kb0 .. kb0 + KBR - 1: tile 2j + h ([8 columns,
        64 k], the wgmma B operand transposed) holds the low (h 0) / high (h 1) nibbles' activations of block j in
        column 4 (j % 2) + 2 ((k // 8) % 2) + h, zero elsewhere (`moe_mma_operands._act_tiles`); only the tiles of
        consumer HALF's steps (of NCONS; step s: tiles 4s .. 4s + 3). Their activations are loaded in one go (the
        tile-by-tile loads were a chain of L2 round trips at the kernel's start: 14 % of its stall samples, s48),
        each tile then picked out of the registers (a sum over the thread's own rows) and stored. CG: loaded past L1
        (the chained kernel's z, written in the same launch)."""
        NQ: gl.constexpr = 4 * (KBR // 2 // NCONS)  # this consumer's tiles
        l3: gl.constexpr = gl.BlockedLayout([NQ, 1, 4], [1, 2, 16], [1, 4, 1], [2, 1, 0])  # [tile, column, k]
        x_l: gl.constexpr = gl.SliceLayout(1, l3)
        q = gl.arange(0, NQ, layout=gl.SliceLayout(1, x_l))
        k = gl.arange(0, 64, layout=gl.SliceLayout(0, x_l))
        tile = 4 * (HALF + NCONS * (q // 4)) + q % 4
        x_ptr = XQ + t.to(gl.int64) * stride_x + kb0 * 128 + 64 * tile[:, None] + k[None, :]
        if CG:
            x = gl.load(x_ptr, cache_modifier=".cg")
        else:
            x = gl.load(x_ptr)
        col = 4 * ((tile % 4) // 2)[:, None] + 2 * ((k // 8) % 2)[None, :] + (tile % 2)[:, None]
        n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, l3)))
        tiles = gl.where(n[None, :, None] == gl.expand_dims(col, 1), gl.expand_dims(x, 1), 0.0)
        q3 = gl.expand_dims(gl.expand_dims(q, 1), 1)
        for i in gl.static_range(NQ):
            b_s.index(4 * (HALF + NCONS * (i // 4)) + i % 4).store(gl.sum(gl.where(q3 == i, tiles, 0.0), axis=0))

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

    @gluon.jit
    def _load_sa(ptr, CG: gl.constexpr):
        """The activation scales of a step (CG: past L1, as `_build_b`)."""
        if CG:
            return gl.load(ptr, cache_modifier=".cg")
        else:
            return gl.load(ptr)

    # ------------------------------------------------------------------ the chained GLU -> down (moe_glu_decode.CHAIN)
    # Polls of a count before a waiting consumer gives up (its pair's y is then wrong, never a hang: a bug shows as a
    # failed test). Each poll is an L2 round trip (≈ 1 µs), so this is far beyond any real wait.
    SPIN_MAX = gl.constexpr(1 << 20)

    @gluon.jit
    def _wait_count(ptr, target):
        """Wait until the int32 count at ptr reaches target (gpu-scope acquire: what its writers released is
        visible to this partition's later loads, which `_build_b` / `_load_sa` take past L1 all the same)."""
        n = gl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
        polls = 0
        while (n < target) & (polls < SPIN_MAX):
            n = gl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
            polls += 1

    # Unit hand-offs from the consumers to the signal warp: a ring of this many (done, taken) barrier pairs
    SIGNAL_RING = gl.constexpr(4)

    @gluon.jit
    def _hand_off(done, taken, j):
        """A consumer partition after storing its partials of its j-th GLU unit: hand the unit to the signal warp
        (its stores before the arrival: a CTA barrier, then the arrival's release), once the slot is taken back."""
        gl.thread_barrier()
        slot = j % SIGNAL_RING
        mbarrier.wait(taken.index(slot), ((j // SIGNAL_RING) & 1) ^ 1)  # (a fresh barrier passes phase 1)
        mbarrier.arrive(done.index(slot), count=1)

    @gluon.jit
    def _signaller(P, IDS, CNT, RDY, TOPK_W, ZQ, ZS, done, taken, num_experts, n_units, n_per, I, limit, stride_ps,
                   stride_pp, stride_zq, stride_zs, T: gl.constexpr, S: gl.constexpr, NCONS: gl.constexpr,
                   RUN: gl.constexpr):
        """The signal warp of the chained kernel: for each of the program's GLU units, once both consumers handed it
        off, one gpu-scope acq_rel count of its z block (2 row tiles x S ranges); the block's last unit finishes
        it (`_finish_block`). The consumers never wait on the counts' round trips."""
        j = 0
        for k in range(_unit_count(n_units, n_per, S, False, RUN)):
            p, tile, sp = _unit(k, n_per, T, S, False, RUN)
            e = gl.load(IDS + p)
            if (e >= 0) & (e < num_experts):
                slot = j % SIGNAL_RING
                mbarrier.wait(done.index(slot), (j // SIGNAL_RING) & 1)
                last = gl.atomic_add(CNT + p * (I // 128) + tile // 2, 1, sem="acq_rel", scope="gpu") == 2 * S - 1
                mbarrier.arrive(taken.index(slot), count=1)
                if last:
                    _finish_block(P, CNT, RDY, p, tile // 2, TOPK_W, ZQ, ZS, I, limit, stride_ps, stride_pp,
                                  stride_zq, stride_zs, S * NCONS)
                j += 1

    @gluon.jit
    def _finish_block(P, CNT, RDY, p, b, TOPK_W, ZQ, ZS, I, limit, stride_ps, stride_pp, stride_zq, stride_zs,
                      RANGES: gl.constexpr):
        """Pair p's z block b by one warp, once all its partials arrived: the RANGES partials summed in range order
        from 0.0 (as `_finish_kernel`), `_glu_out`'s epilogue with z quantised into ZQ / ZS; the block's counter
        zeroed, the block counted in RDY[p] (release: z's stores first)."""
        lay: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [1, 1], [1, 0])  # [1, 128]: 4 channels a thread
        offs = gl.arange(0, 128, layout=gl.SliceLayout(0, lay))[None, :]
        src = P + p.to(gl.int64) * stride_pp + b * 128 + offs
        gate = gl.zeros([1, 128], gl.float32, layout=lay)
        up = gl.zeros([1, 128], gl.float32, layout=lay)
        for s in gl.static_range(RANGES):
            gate += gl.load(src + s * stride_ps, cache_modifier=".cg")
            up += gl.load(src + s * stride_ps + I, cache_modifier=".cg")
        z = _swiglu_z(gate, up, TOPK_W + p, limit)
        q, sc = _quant_rows(z.to(gl.float32))
        gl.store(ZQ + p.to(gl.int64) * stride_zq + b * 128 + _act_pos(offs), q.to(gl.float16))
        gl.store(ZS + p.to(gl.int64) * stride_zs + b + gl.arange(0, 1, layout=gl.SliceLayout(1, lay)), sc)
        gl.store(CNT + p * (I // 128) + b, 0)  # (every unit of the block counted: ready for the next launch)
        gl.thread_barrier()  # (z's stores before the release)
        gl.atomic_add(RDY + p, 1, sem="release", scope="gpu")

    @gluon.jit
    def _reset_last(RDY, n_pairs):
        """At a chained program's end: count it in RDY[n_pairs]; the last program zeroes RDY[:n_pairs + 1] (every
        wait on them in this launch is over)."""
        if gl.atomic_add(RDY + n_pairs, 1, sem="acq_rel", scope="gpu") == gl.num_programs(0) - 1:
            lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
            for i0 in range(0, n_pairs + 1, 128):
                i = i0 + gl.arange(0, 128, layout=lay)
                gl.store(RDY + i, gl.zeros([128], gl.int32, layout=lay), mask=i <= n_pairs)

    @pdl_kernel
    @triton.jit(do_not_specialize=["num_experts"])
    def _finish_kernel(P, IDS, TOPK_W, ZQ, ZS, I, num_experts, limit, stride_ps, stride_pp, stride_zq, stride_zs,
                       S: tl.constexpr):
        """z of pair program_id(0), channels [128 b, +128) (b = program_id(1)): the S partials summed in range
        order from 0.0 (as `moe_gemv._split_sum`), then `_glu_out`'s epilogue with z quantised."""
        pdl_wait()
        p = tl.program_id(0).to(tl.int64)
        b = tl.program_id(1)
        e = tl.load(IDS + p)
        if (e < 0) | (e >= num_experts):
            return
        offs = tl.arange(0, 128)
        src = P + p * stride_pp + b * 128 + offs
        gate = tl.zeros((128,), dtype=tl.float32)
        up = tl.zeros((128,), dtype=tl.float32)
        for s in tl.static_range(S):
            gate += tl.load(src + s * stride_ps)
            up += tl.load(src + s * stride_ps + I)
        _glu_out(gate, up, p, b, offs, TOPK_W, ZQ, ZS, limit, stride_zq, stride_zs, BN=128, QUANT_OUT=True)
