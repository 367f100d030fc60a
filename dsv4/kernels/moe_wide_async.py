"""`moe_wide`'s two grouped GEMMs with the weight widening overlapped with the tensor cores (Gluon).

Why: in `dsv4.kernels.moe_wide` the same warps widen a 32-wide weight group (CUDA cores) and then issue its
wgmma; Triton's `tl.dot` waits for every wgmma whose A operand comes from registers (`wgmma.wait_group 0`
right after each one), so widening and MMA take turns (docs/benchmarks.md #5, session 9). Here the loop is
written out in Gluon (`triton.experimental.gluon`, explicit layouts and asynchronous wgmma):

    issue wgmma(group g) asynchronously         tensor cores
    widen group g + 1 into registers            CUDA cores, while the MMA runs
    wait for wgmma(g) (keeping its registers)   then the next step

Two K loops, both fed by one cp.async ring of 64-wide K halves (the activation tiles and the packed weight
bytes, STAGES slots; session 10's first version loaded the weights synchronously and ran 1.7x slower than
the Triton kernel):
- `_ring_loop`: the widened weights are the MMA's register operand, one group step in flight (ptxas
  serialises an MMA whose register operand is defined while an earlier MMA is in flight, C7513);
- `_smem_ring_loop` (`a_smem`): the widened half goes to a 2-slot shared-memory buffer and the MMAs read it
  there, one half in flight while the next is widened, so the tensor cores always have queued work.

The widening here is bf16x2 bit moves and one bf16x2 multiply per k pair of a row (`BF16_LO_PTX`), read as
16-bit k-pair words: ≈ 4.5 instructions per pair against ≈ 10.5 for `moe_wide`'s f16 path (f16 bit moves,
f16 -> f32, an fp32 multiply and a bf16 pack per element, bytes unpacked and repacked around the asm). The
values are `moe_wide`'s exactly (e2m1 * 2^(b - 127) in bf16, one fp32 chain over K; the GLU epilogue quantises
z per token and 128 channels and stores it dequantised): the outputs are bit-identical to the Triton kernel's
on the H200 (tests/gpu/test_moe_wide.py).

Measured (H200, Flash MoE, ms L2-flushed, bench/runs/run_device_s10d.sh), Triton kernel -> this one:
128-row tiles through shared memory, 4 slots: M = 4096 5.53 -> 4.86, M = 8192 10.53 -> 9.30 (registers:
5.09, 9.88); 64-row tiles in registers: M = 2048 4.18 (s10c) -> 3.79. The default (`moe_wide.ASYNC`).
Session 27 (s27c), f16 -> bf16 widening, the whole MoE call: M = 2048 3.29 -> 2.45, 4096 4.27 -> 3.84, 8192
7.90 -> 6.85, 16384 14.29 -> 12.60 (the GLU's loop: 998 -> 610 instructions per thread per 128-wide K block).
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

# bf16 widening, per k pair of one row: its two bytes b0, b1 (one 16-bit load) are spread once to b0 | b1 << 16
# (SPREAD); then for either nibble (LO, HI) a mask, an integer multiply by two disjoint powers of two (a pair of
# shifts without carries) and a mask put its sign at bit 15 and its magnitude bits (exponent, mantissa) at bits
# 8..6 of each 16-bit half: the bf16 of e2m1 * 2^-126 (code 1, 0.5, lands on a bf16 subnormal, which mul.bf16x2
# keeps), and one multiply by the row's bf16x2 2^(b - 1) gives e2m1 * 2^(b - 127) exactly.
SPREAD_PTX = "{ .reg .b32 t; cvt.u32.u16 t, $1; prmt.b32 $0, t, 0, 0x7170; }"
SPREAD2_PTX = "prmt.b32 $0, $2, 0, 0x7170; prmt.b32 $1, $2, 0, 0x7372;"  # two pairs' words in one register
_BF16_NIBBLE = ("{ .reg .b32 t; and.b32 t, $1, %s; mul.lo.u32 t, t, %s; and.b32 t, t, 0x81C081C0; "
                "mul.rn.bf16x2 $0, t, $2; }")
BF16_LO_PTX = _BF16_NIBBLE % ("0x000F000F", "0x1040")  # bits 0..3 -> sign << 12, magnitude << 6
BF16_HI_PTX = _BF16_NIBBLE % ("0x00F000F0", "0x104")  # bits 4..7 -> sign << 8, magnitude << 2


if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    from dsv4.kernels.fp8_linear import _pow2_scale

    @gluon.jit
    def block_rows(SORTED, row0, num_pairs, top_k, BM: gl.constexpr, layout: gl.constexpr, GLU: gl.constexpr):
        """The BM rows from sorted slot row0 of `moe_align`'s layout in a 1-D layout: (sorted slots, valid mask,
        int64 activation rows -- GLU: the pairs' tokens, else the slots themselves, as z is stored in sorted
        order)."""
        slots = row0 + gl.arange(0, BM, layout=layout)
        pair = gl.load(SORTED + slots)
        valid = pair < num_pairs
        if GLU:
            rows = gl.where(valid, pair // top_k, 0).to(gl.int64)
        else:
            rows = slots.to(gl.int64)
        return slots, valid, rows

    @gluon.jit
    def tile_block(TILES, NUM_POST, pid_m, BM: gl.constexpr, LISTED: gl.constexpr):
        """Program pid_m's tile: (its first 64-row block, TILES[pid_m] of a 64-row alignment when LISTED, else block
        pid_m of a BM-row alignment; its first sorted row; whether it has one: TILES -1, or past NUM_POST)."""
        if LISTED:
            blk = gl.load(TILES + pid_m)
            live = blk >= 0
            row0 = blk * 64
        else:
            blk = pid_m
            row0 = pid_m * BM
            live = row0 < gl.load(NUM_POST)
        return blk, row0, live

    @gluon.jit
    def launch_order(GROUP_M: gl.constexpr):
        """(row block, column tile) of this program: GROUP_M row blocks x every column tile, then the next GROUP_M
        blocks (0: the grid's own order, row block fastest)."""
        pid_m = gl.program_id(0)
        pid_n = gl.program_id(1)
        if GROUP_M > 0:
            num_m = gl.num_programs(0)
            pid = pid_m + pid_n * num_m
            width = GROUP_M * gl.num_programs(1)
            first_m = (pid // width) * GROUP_M
            size_m = gl.minimum(num_m - first_m, GROUP_M)
            pid_m = first_m + (pid % width) % size_m
            pid_n = (pid % width) // size_m
        return pid_m, pid_n

    @gluon.jit
    def swiglu(acc, acc_u, TOPK_W, cpair, cvalid, limit):
        """The GLU epilogue in the accumulators' layout [channels, pairs]: gate and up rounded to bf16, clamped,
        silu(gate) * up times the pair's routing weight, as bf16 z (the reference's order)."""
        gate = gl.minimum(acc.to(gl.bfloat16).to(gl.float32), limit)
        up = gl.minimum(gl.maximum(acc_u.to(gl.bfloat16).to(gl.float32), -limit), limit)
        rw = gl.load(TOPK_W + cpair, mask=cvalid, other=0.0)
        return ((gate / (1.0 + gl.exp(-gate)) * up) * rw[None, :]).to(gl.bfloat16)

    _SPREAD_ASM = gl.constexpr(SPREAD_PTX)
    _SPREAD2_ASM = gl.constexpr(SPREAD2_PTX)
    _BF16_LO_ASM = gl.constexpr(BF16_LO_PTX)
    _BF16_HI_ASM = gl.constexpr(BF16_HI_PTX)

    @gluon.constexpr_function
    def pair_layout(bn, nw, pair_first=False):
        """The layout of uint16 [bn, 16] k-pair words (bytes 2p, 2p + 1 of a row's 32 weight bytes) whose two
        widened halves, joined and reshaped to [bn, 32], are the wgmma A operand layout of `_wide_async_kernel`
        (16-bit, k_width 2): pair p = lane % 4 + 4 r1 + 8 r2, rows lane // 4 + 8 r0 + 16 warp + 16 nw rep;
        pair_first: registers r0, r1 swapped (pairs p and p + 4 of a row adjacent, as `_load_bytes` packs them
        with a `pair_view` order)."""
        reps = [[16 * nw * (1 << i), 0] for i in range((bn // (16 * nw)).bit_length() - 1)]
        first = [[0, 4], [8, 0]] if pair_first else [[8, 0], [0, 4]]
        return gl.DistributedLinearLayout(reg_bases=first + [[0, 8]] + reps,
                                          lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                          warp_bases=[[16 * (1 << i), 0] for i in range(nw.bit_length() - 1)],
                                          block_bases=[], shape=[bn, 16])

    @gluon.constexpr_function
    def pair_view(bn, perm):
        """The shared-memory view of a [bn, 32]-byte ring slot as uint16 [bn, 16] k-pair words in which, within
        each run of 4 * 2^perm pairs of a row, stored pair 2^perm p + i is logical pair p + 4 i (p < 4, i <
        2^perm; perm 0: the identity; `moe_wide.permute_pairs`). In `pair_layout` a thread's pairs p,
        p + 4, p + 8, p + 12 of a row then lie in 2^perm adjacent words: one 32-bit (perm 1; ptxas picks ldmatrix)
        or 64-bit (perm 2) load for 2 or 4 pairs instead of 16-bit loads (s31d: 48 LDS.U16 took 11 % of the GLU's
        stall samples). The activations' columns are permuted to match (`moe_wide.dequantized_act`'s perm)."""
        within = [[0, 4 << b] for b in range(perm)] + [[0, 1], [0, 2]] + [[0, 4 << b] for b in range(perm, 2)]
        return gl.SharedLinearLayout(offset_bases=within + [[1 << b, 0] for b in range(bn.bit_length() - 1)])

    @gluon.jit
    def _load_bytes(buf, p_l: gl.constexpr, PERM: gl.constexpr = 0, PACKED: gl.constexpr = False):
        """A [BN, 32] ring slot of weight bytes as uint32 [BN, 16] spread k-pair words in p_l (`pair_layout`
        or its shared-memory-path counterpart), the pairs in `pair_view`'s order PERM: one prmt per pair
        (SPREAD_PTX)."""
        BN: gl.constexpr = buf.shape[0]
        view: gl.constexpr = pair_view(BN, PERM) if PERM > 0 else buf.layout
        wb = buf._reinterpret(gl.uint16, [BN, 16], view).load(p_l)
        if PACKED:  # two adjacent words per 32-bit register (p_l's first register basis: the stored order's next)
            return gl.inline_asm_elementwise(_SPREAD2_ASM, "=r,=r,r", [wb], dtype=gl.uint32, is_pure=True, pack=2)
        return gl.inline_asm_elementwise(_SPREAD_ASM, "=r,h", [wb], dtype=gl.uint32, is_pure=True, pack=1)

    @gluon.jit
    def _widen(wb, sc, g, HI: gl.constexpr, a_l: gl.constexpr):
        """bf16 [BN, 32] weights of group g (0..3, constant or not) of a 128-wide K block, in a_l, from the
        spread k-pair words of its half (`_load_bytes`; low nibbles: even groups, HI: odd) and the rows'
        packed scale words: bf16x2 bit moves and one bf16x2 multiply per k pair (`BF16_LO_PTX`)."""
        s2 = ((sc >> (8 * g)) & 0xFF) * 0x800080 + 0x3F003F00  # bf16x2 2^(b - 1): exponent field b + 126
        s2 = gl.convert_layout(s2, gl.SliceLayout(1, wb.type.layout))[:, None]
        if HI:
            w = gl.inline_asm_elementwise(_BF16_HI_ASM, "=r,r,r", [wb, s2], dtype=gl.uint32, is_pure=True, pack=1)
        else:
            w = gl.inline_asm_elementwise(_BF16_LO_ASM, "=r,r,r", [wb, s2], dtype=gl.uint32, is_pure=True, pack=1)
        lo = (w & 0xFFFF).to(gl.uint16).to(gl.bfloat16, bitcast=True)
        hi = (w >> 16).to(gl.uint16).to(gl.bfloat16, bitcast=True)
        BN: gl.constexpr = wb.shape[0]
        return gl.convert_layout(gl.join(lo, hi).reshape([BN, 32]), a_l)

    @gluon.jit
    def widen_probe(PACKED, SC, OUT, G: gl.constexpr, HI: gl.constexpr, PERM: gl.constexpr = 0):
        """Test hook: `_widen` of 64 rows of 32 packed bytes each (one scale word per row) per program, through
        a ring-slot-shaped shared-memory buffer and `_load_bytes` (pair order PERM) as in the kernel, stored as
        bf16 [rows, 32] in the kernel's k order."""
        NW: gl.constexpr = gl.num_warps()
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, 128, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
        c_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[16, 2],
                                             warps_per_cta=[NW, 1], order=[1, 0])
        row0 = gl.program_id(0) * 64
        r = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, c_l))
        c = gl.arange(0, 32, layout=gl.SliceLayout(0, c_l))
        buf = gl.allocate_shared_memory(gl.uint8, [64, 32], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
        buf.store(gl.load(PACKED + r[:, None] * 32 + c[None, :]))
        gl.thread_barrier()
        wb = _load_bytes(buf, pair_layout(64, NW, PERM > 0), PERM, PERM > 0)
        sc = gl.load(SC + row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, a_l)))
        w = _widen(wb, sc, G, HI, a_l)
        r = row0 + gl.arange(0, 64, layout=gl.SliceLayout(1, a_l))
        c = gl.arange(0, 32, layout=gl.SliceLayout(0, a_l))
        gl.store(OUT + r[:, None] * 32 + c[None, :], w)

    @gluon.jit
    def _issue_half(x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, j, nhalves, STAGES: gl.constexpr,
                    GLU: gl.constexpr):
        """cp.async of 64-wide K half j (its two 32-column activation tiles and the 32 weight bytes per row
        that hold both groups) into ring slot j % STAGES; one commit group per half (empty past the end)."""
        if j < nhalves:
            slot = j % STAGES
            async_copy.async_copy_global_to_shared(x_s.index(2 * slot), x_ptrs + j * 64, mask=x_mask)
            async_copy.async_copy_global_to_shared(x_s.index(2 * slot + 1), x_ptrs + j * 64 + 32, mask=x_mask)
            async_copy.async_copy_global_to_shared(w_s.index(slot), wc_ptrs + j * 32)
            if GLU:
                async_copy.async_copy_global_to_shared(u_s.index(slot), uc_ptrs + j * 32)
        async_copy.commit_group()

    @gluon.jit
    def _ring_loop(acc, acc_u, x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, s_ptrs, su_ptrs, nblocks,
                   a_l: gl.constexpr, GLU: gl.constexpr, STAGES: gl.constexpr, p_l: gl.constexpr,
                   PERM: gl.constexpr):
        """K loop, 64-wide halves through a STAGES-slot cp.async ring (activations and weight bytes): each
        32-wide group issues its MMAs asynchronously, then the next group is widened from registers (or from
        the next half's slot) while they run, then they are waited for -- one step in flight, as ptxas
        requires for a register operand. The scale words are prefetched one 128-wide block ahead."""
        PACK: gl.constexpr = PERM > 0  # (p_l is then `pair_layout(..., pair_first=True)`)
        nhalves = 2 * nblocks
        for s in gl.static_range(STAGES - 1):
            _issue_half(x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, s, nhalves, STAGES, GLU)
        sc = gl.load(s_ptrs)
        sc_u = sc
        if GLU:
            sc_u = gl.load(su_ptrs)
        async_copy.wait_group(STAGES - 2)
        wb = _load_bytes(w_s.index(0), p_l, PERM, PACK)
        w = _widen(wb, sc, 0, False, a_l)
        wb_u = wb
        w_u = w
        if GLU:
            wb_u = _load_bytes(u_s.index(0), p_l, PERM, PACK)
            w_u = _widen(wb_u, sc_u, 0, False, a_l)
        for kb in range(nblocks):
            nxt = gl.minimum(kb + 1, nblocks - 1)
            sc_next = gl.load(s_ptrs + nxt)
            sc_u_next = sc_next
            if GLU:
                sc_u_next = gl.load(su_ptrs + nxt)
            for h in gl.static_range(2):
                j = 2 * kb + h
                # the slot of half j - 1: its MMAs have completed and its bytes are in registers
                _issue_half(x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, j + STAGES - 1, nhalves, STAGES, GLU)
                fence_async_shared()
                slot = j % STAGES
                for sub in gl.static_range(2):
                    xt = x_s.index(2 * slot + sub).permute((1, 0))
                    tok = warpgroup_mma(w, xt, acc, is_async=True)
                    if GLU:
                        tok_u = warpgroup_mma(w_u, xt, acc_u, is_async=True)
                    if sub == 0:  # the high nibbles of the bytes in registers
                        w_next = _widen(wb, sc, 2 * h + 1, True, a_l)
                        if GLU:
                            w_u_next = _widen(wb_u, sc_u, 2 * h + 1, True, a_l)
                    else:  # the low nibbles of the next half (clamped at the end: a harmless re-read)
                        async_copy.wait_group(STAGES - 2)
                        nslot = gl.minimum(j + 1, nhalves - 1) % STAGES
                        wb = _load_bytes(w_s.index(nslot), p_l, PERM, PACK)
                        if GLU:
                            wb_u = _load_bytes(u_s.index(nslot), p_l, PERM, PACK)
                        if h == 0:
                            w_next = _widen(wb, sc, 2, False, a_l)
                            if GLU:
                                w_u_next = _widen(wb_u, sc_u, 2, False, a_l)
                        else:
                            w_next = _widen(wb, sc_next, 0, False, a_l)
                            if GLU:
                                w_u_next = _widen(wb_u, sc_u_next, 0, False, a_l)
                    if GLU:
                        acc, acc_u, w, w_u = warpgroup_mma_wait(num_outstanding=0, deps=[tok, tok_u, w, w_u])
                        w_u = w_u_next
                    else:
                        acc, w = warpgroup_mma_wait(num_outstanding=0, deps=[tok, w])
                    w = w_next
            sc = sc_next
            sc_u = sc_u_next
        return acc, acc_u

    @gluon.jit
    def _smem_half(acc, acc_u, x_s, w_s, u_s, wa_s, wu_s, j, sc, sc_u, c_l: gl.constexpr, GLU: gl.constexpr,
                   STAGES: gl.constexpr, p_l: gl.constexpr, PERM: gl.constexpr):
        """Half j (landed in its ring slot): widen its two groups into weight slot j % 2 of shared memory and
        issue their MMAs asynchronously (one commit group per MMA)."""
        slot = j % STAGES
        wslot = (j % 2) * 2
        g = (j % 2) * 2  # its first group within the 128-wide block
        wb = _load_bytes(w_s.index(slot), p_l, PERM)
        wa_s.index(wslot).store(_widen(wb, sc, g, False, c_l))
        wa_s.index(wslot + 1).store(_widen(wb, sc, g + 1, True, c_l))
        if GLU:
            wb_u = _load_bytes(u_s.index(slot), p_l, PERM)
            wu_s.index(wslot).store(_widen(wb_u, sc_u, g, False, c_l))
            wu_s.index(wslot + 1).store(_widen(wb_u, sc_u, g + 1, True, c_l))
        fence_async_shared()
        for sub in gl.static_range(2):
            xt = x_s.index(2 * slot + sub).permute((1, 0))
            acc = warpgroup_mma(wa_s.index(wslot + sub), xt, acc, is_async=True)
            if GLU:
                acc_u = warpgroup_mma(wu_s.index(wslot + sub), xt, acc_u, is_async=True)
        return acc, acc_u

    @gluon.jit
    def _smem_ring_loop(acc, acc_u, x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sc_ptrs, suc_ptrs, nblocks,
                        BN: gl.constexpr, c_l: gl.constexpr, GLU: gl.constexpr, STAGES: gl.constexpr,
                        p_l: gl.constexpr, PERM: gl.constexpr):
        """K loop with the widened weights through shared memory (2 slots of a 64-wide half): half j is
        widened and stored while half j - 1's MMAs still run (one half left in flight, so the tensor cores
        always have queued work), then its MMAs are issued. The ring refills the slot of half j - 2, whose
        MMAs have completed: STAGES - 2 halves load ahead. Half 0 is peeled off the loop so that every
        accumulator value reaching the final wait comes from a wgmma (else ptxas serialises them, C7515)."""
        a_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        wa_s = gl.allocate_shared_memory(gl.bfloat16, [4, BN, 32], a_sl)
        wu_s = wa_s
        if GLU:
            wu_s = gl.allocate_shared_memory(gl.bfloat16, [4, BN, 32], a_sl)
        AHEAD: gl.constexpr = STAGES - 2
        nhalves = 2 * nblocks
        for s in gl.static_range(AHEAD + 1):
            _issue_half(x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, s, nhalves, STAGES, GLU)
        sc = gl.load(sc_ptrs)
        sc_u = sc
        if GLU:
            sc_u = gl.load(suc_ptrs)
        async_copy.wait_group(AHEAD)
        acc, acc_u = _smem_half(acc, acc_u, x_s, w_s, u_s, wa_s, wu_s, 0, sc, sc_u, c_l, GLU, STAGES, p_l, PERM)
        if GLU:  # (waits for nothing: the loop carries the accumulators as tensors)
            acc, acc_u = warpgroup_mma_wait(num_outstanding=4, deps=[acc, acc_u])
        else:
            acc = warpgroup_mma_wait(num_outstanding=2, deps=[acc])
        for j in range(1, nhalves):
            sc = gl.load(sc_ptrs + j // 2)  # (an L1 hit every other half)
            if GLU:
                sc_u = gl.load(suc_ptrs + j // 2)
            _issue_half(x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, j + AHEAD, nhalves, STAGES, GLU)
            async_copy.wait_group(AHEAD)
            acc, acc_u = _smem_half(acc, acc_u, x_s, w_s, u_s, wa_s, wu_s, j, sc, sc_u, c_l, GLU, STAGES, p_l, PERM)
            if GLU:  # half j - 1's MMAs are done: its ring slot and weight slot are free
                acc, acc_u = warpgroup_mma_wait(num_outstanding=4, deps=[acc, acc_u])
            else:
                acc = warpgroup_mma_wait(num_outstanding=2, deps=[acc])
        if GLU:
            acc, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=[acc, acc_u])
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
        return acc, acc_u

    @gluon.jit
    def store_tile(acc, acc_u, C, SORTED, TOPK_W, row0, pid_n, num_pairs, limit, stride_cm, valid, acc_l: gl.constexpr,
                   BM: gl.constexpr, BN: gl.constexpr, GLU: gl.constexpr, CHECK: gl.constexpr,
                   STORE_T: gl.constexpr = False):
        """The epilogue in the accumulator layout [BN channels, BM pairs]: GLU z in sorted order (with 128 channels
        quantised as W2's input), GEMM2 bf16 rows per pair; CHECK: nothing stored unless `valid`. STORE_T: the
        tile is moved (through shared memory) to a layout with 8 channels per thread before the store, so each
        thread stores 16 contiguous bytes (the accumulator's neighbours are pairs, one row apart: 16-bit stores)."""
        if GLU:  # (the routing weight per pair: the sorted ids in the accumulator's layout)
            cpair = gl.load(SORTED + row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, acc_l)))
            z = swiglu(acc, acc_u, TOPK_W, cpair, cpair < num_pairs, limit)
            if BN == 128:  # W2's input quantisation (act_quant): per pair, over these 128 channels
                zf = z.to(gl.float32)
                s, inv = _pow2_scale(gl.maximum(gl.max(gl.abs(zf), axis=0), 1e-4))
                q = gl.minimum(gl.maximum(zf * inv[None, :], -448.0), 448.0).to(gl.float8e4nv)
                z = (q.to(gl.float32) * s[None, :]).to(gl.bfloat16)  # exact
            # (narrower tiles store z as is: `moe_wide.requant_rows` quantises it per 128 afterwards)
        else:
            z = acc.to(gl.bfloat16)
        out_l: gl.constexpr = gl.BlockedLayout([8, 1], [BN // 8, 256 // BN], [1, gl.num_warps()], [0, 1]) \
            if STORE_T else acc_l
        if STORE_T:
            z = gl.convert_layout(z, out_l)
        cp = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, out_l))
        cn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, out_l))
        if GLU:  # z in sorted order
            ptrs = C + cp.to(gl.int64)[None, :] * stride_cm + cn[:, None]
            if CHECK:
                gl.store(ptrs, z, mask=valid & (cn[:, None] >= 0))
            else:
                gl.store(ptrs, z)
        else:  # y per pair (the mask broadcast along channels, so it keeps their 8-wide runs)
            cpair = gl.load(SORTED + cp)
            mask = (cpair < num_pairs)[None, :]
            if CHECK:
                mask = mask & valid
            gl.store(C + cpair.to(gl.int64)[None, :] * stride_cm + cn[:, None], z, mask=mask)

    @gluon.jit
    def _wide_async_kernel(
        A, W, WS, C, SORTED, EXPERT_IDS, NUM_POST, TOPK_W,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm, TILES,
        BM: gl.constexpr, BN: gl.constexpr, GLU: gl.constexpr, NW: gl.constexpr, STAGES: gl.constexpr,
        A_SMEM: gl.constexpr, GROUP_M: gl.constexpr, LISTED: gl.constexpr, PERM: gl.constexpr,
        STORE_T: gl.constexpr,
    ):
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
        x_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[8, 4], warps_per_cta=[NW, 1],
                                             order=[1, 0])
        x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        pid_m, pid_n = launch_order(GROUP_M)
        blk, row0, live = tile_block(TILES, NUM_POST, pid_m, BM, LISTED)
        if not live:
            return
        e = gl.load(EXPERT_IDS + blk).to(gl.int64)

        # activation rows of the block (GLU: the pairs' tokens; GEMM2: z in sorted order), 32 columns per group
        _, xvalid, rows = block_rows(SORTED, row0, num_pairs, top_k, BM, gl.SliceLayout(1, x_l), GLU)
        xk = gl.arange(0, 32, layout=gl.SliceLayout(0, x_l))
        x_ptrs = A + rows[:, None] * stride_am + xk[None, :]
        x_mask = xvalid[:, None] & (xk[None, :] < 32)
        x_s = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BM, 32], x_sl)

        # weight bytes: cp.async'd 16 per thread (coalesced) into the ring, read back in the wgmma A-operand
        # layout; the scale words are read in that layout's rows
        c_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[16, 2],
                                             warps_per_cta=[NW, 1], order=[1, 0])
        w_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        cn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, c_l))
        ck = gl.arange(0, 32, layout=gl.SliceLayout(0, c_l))
        wc_ptrs = W + e * stride_we + cn[:, None].to(gl.int64) * stride_wn + ck[None, :]
        uc_ptrs = wc_ptrs + up_off * stride_wn
        wn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, a_l))
        s_ptrs = WS + e * stride_wse + wn.to(gl.int64) * stride_wsn
        su_ptrs = s_ptrs + up_off * stride_wsn
        w_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, 32], w_sl)
        u_s = w_s
        if GLU:
            u_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BN, 32], w_sl)

        acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        acc_u = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        if A_SMEM:
            sc_ptrs = WS + e * stride_wse + cn.to(gl.int64) * stride_wsn
            acc, acc_u = _smem_ring_loop(acc, acc_u, x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, sc_ptrs,
                                         sc_ptrs + up_off * stride_wsn, K // 128, BN, c_l, GLU, STAGES,
                                         gl.BlockedLayout([1, 8], [16, 2], [NW, 1], [1, 0]), PERM)  # c_l in k pairs
        else:
            acc, acc_u = _ring_loop(acc, acc_u, x_s, w_s, u_s, x_ptrs, x_mask, wc_ptrs, uc_ptrs, s_ptrs, su_ptrs,
                                    K // 128, a_l, GLU, STAGES, pair_layout(BN, NW, PERM > 0), PERM)

        store_tile(acc, acc_u, C, SORTED, TOPK_W, row0, pid_n, num_pairs, limit, stride_cm, True, acc_l, BM, BN, GLU,
                   False, STORE_T)


def launch(kernel_args: tuple, grid: tuple, bm: int, bn: int, glu: bool, num_warps: int, stages: int,
           a_smem: bool = False, group_m: int = 0, tiles=None, perm: int = 0, store_t: bool = False):
    """`_wide_async_kernel[grid](*kernel_args)` with the layout constants (the argument order of
    `moe_wide._wide_kernel` up to its constexprs); stages: ring slots of 64-wide K halves; a_smem: the
    widened weights through shared memory (`_smem_ring_loop`, needs stages >= 3); group_m: the programs' launch
    order (`moe_wide.ASYNC_GROUP_M`); tiles: int32 [grid[0]], program i's tile starts at 64-row block tiles[i] of
    a 64-row alignment (-1: no tile; `moe_wide.mixed_tiles`); perm: the weight pairs' order (`pair_view`; the
    activation's columns must be in the same order); store_t: `store_tile`'s STORE_T (ignored for tiles
    narrower than its layout). Returns the compiled kernel (registers and shared memory for the benchmarks)."""
    if stages < (3 if a_smem else 2):
        raise ValueError(f"moe_wide_async: stages {stages} too few (a_smem={a_smem})")
    if bn < 16 * num_warps:  # the weight-byte copy layout covers 16 rows per warp
        raise ValueError(f"moe_wide_async: bn {bn} < 16 x {num_warps} warps")
    store_t = store_t and bm >= (256 // bn) * num_warps  # (its layout spans 256 / bn pairs per warp)
    listed = tiles is not None  # without a list, TILES is never read: EXPERT_IDS (kernel_args[5]) stands in
    return _wide_async_kernel[grid](*kernel_args, tiles if listed else kernel_args[5], BM=bm, BN=bn, GLU=glu,
                                    NW=num_warps, STAGES=stages, A_SMEM=a_smem, GROUP_M=group_m, LISTED=listed,
                                    PERM=perm, STORE_T=store_t, num_warps=num_warps)
