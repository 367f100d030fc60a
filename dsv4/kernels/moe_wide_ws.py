"""The prefill MoE's GEMMs as warp-specialised Gluon kernels: loader, widener and MMA warpgroups on mbarrier rings.

Why (docs/kernels_e2e_notes.md, session 28): `moe_wide_async`'s GLU issues its MMAs with the widened weights as
the register operand, and ptxas lets no such MMA start while an earlier one is in flight, so each group step waits
for the last; removing instructions, barriers or ring depth around that chain did not move it (52 % tensor pipe).
Here the MMAs read both operands from shared memory and keep a whole 64-wide K half queued while the next is
issued, and the widening runs on other warps:

    loader   (4 warps)  cp.async of half j's two 32-column activation tiles (GLU: the pairs' token rows; GEMM2:
                        z's rows) and the weight bytes of its rows into ring slot j % S1; the copies arrive on full1
    widener  (4 warps)  reads the bytes (then frees them on empty1), widens both 32-wide groups to bf16
                        (`moe_wide_async._widen`, exact) into slot j % S2 of a second ring; arrives on full2
                        (WIDENERS = 2: 8 warps, each thread widening half as much)
    MMA      (4 or 8)   waits for full1 and full2, issues half j's wgmmas, waits until half j - 1's have completed
                        and frees its slots (empty1, empty2); the epilogue as moe_wide_async's

Tiles of BM pairs x 128 weight rows: the GLU's are the gate and the up rows of 64 channels (one MMA warpgroup, two
accumulators; z stored unquantised, `moe_wide.requant_rows` follows as for the 64-row register GLU), GEMM2's 128
output channels (two MMA warpgroups sharing the z tile). Same operands and the same wgmma chain over K as
`moe_wide_async`, so the outputs should be bit-identical to that kernel's.

Status (H200, s29a/s29c, docs/benchmarks.md session 29): correct (bit-identical to the default kernels) but slower:
the Flash MoE call at M = 8192 takes 9.19 ms with the WS GLU against 6.87. With `PROBE` taking one partition's work
out, the loader + widener alone and the loader + MMA warps alone each run about as long as the default GLU, and
together they add up instead of overlapping (deeper rings, 8 widening warps: no better). Kept opt-in through
`moe_wide.WS_GLU` / `WS_DOWN`; tests/gpu/test_moe_wide.py compares them with the default kernels.
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

S1 = 4  # ring slots of activation tiles and weight bytes (64-wide K halves)
S2 = 2  # ring slots of widened weights
WARPS = 4  # per partition (Triton rounds worker partitions up to whole warpgroups anyway)
WIDENERS = 1  # widening warpgroups (2: each thread widens half as much, if one warpgroup cannot keep up)
# the widener's and the loader's registers (setmaxnreg) by (GLU, WIDENERS); the MMA warps get the rest
# measurement probe (bench only; outputs are then wrong): 0 off, 1 the MMA warps issue no wgmma, 2 the widener
# neither reads nor widens nor stores (the MMAs read stale tiles)
PROBE = 0
REGS = {(True, 1): (192, 96), (False, 1): (128, 64), (True, 2): (112, 64), (False, 2): (80, 48)}

if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)

    from dsv4.kernels.moe_wide_async import _load_bytes, _widen, block_rows, launch_order, store_tile

    @gluon.jit
    def _loader(A, W, SORTED, x_s, w_s, u_s, full1, empty1, row0, e, pid_n, nhalves, num_pairs, top_k, up_off,
                stride_am, stride_we, stride_wn, BM: gl.constexpr, BN: gl.constexpr, S1: gl.constexpr,
                GLU: gl.constexpr):
        NW: gl.constexpr = gl.num_warps()
        x_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [NW, 1], [1, 0])
        _, xvalid, rows = block_rows(SORTED, row0, num_pairs, top_k, BM, gl.SliceLayout(1, x_l), GLU)
        xk = gl.arange(0, 32, layout=gl.SliceLayout(0, x_l))
        x_ptrs = A + rows[:, None] * stride_am + xk[None, :]
        x_mask = xvalid[:, None] & (xk[None, :] < 32)
        c_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [NW, 1], [1, 0])
        cn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, c_l))
        ck = gl.arange(0, 32, layout=gl.SliceLayout(0, c_l))
        wc_ptrs = W + e * stride_we + cn[:, None].to(gl.int64) * stride_wn + ck[None, :]
        uc_ptrs = wc_ptrs + up_off * stride_wn
        for j in range(nhalves):
            s = j % S1
            mbarrier.wait(empty1.index(s), ((j // S1) & 1) ^ 1)  # (the first round passes: a fresh barrier)
            async_copy.async_copy_global_to_shared(x_s.index(2 * s), x_ptrs + j * 64, mask=x_mask)
            async_copy.async_copy_global_to_shared(x_s.index(2 * s + 1), x_ptrs + j * 64 + 32, mask=x_mask)
            async_copy.async_copy_global_to_shared(w_s.index(s), wc_ptrs + j * 32)
            if GLU:
                async_copy.async_copy_global_to_shared(u_s.index(s), uc_ptrs + j * 32)
            async_copy.mbarrier_arrive(full1.index(s), increment_count=False)  # once this thread's copies land

    @gluon.jit
    def _widener(WS, w_s, u_s, a_s, au_s, full1, empty1, full2, empty2, e, pid_n, nhalves, up_off, stride_wse,
                 stride_wsn, BN: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr, GLU: gl.constexpr,
                 PROBE: gl.constexpr):
        NW: gl.constexpr = gl.num_warps()
        WR: gl.constexpr = NW if NW * 16 <= BN else BN // 16  # warps along the rows, the others split the columns
        WC: gl.constexpr = NW // WR
        c_l: gl.constexpr = gl.BlockedLayout([1, 16 // WC], [16, 2], [WR, WC], [1, 0])  # widened [BN, 32] tiles
        p_l: gl.constexpr = gl.BlockedLayout([1, 8 // WC], [16, 2], [WR, WC], [1, 0])  # ... in k pairs
        cn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, c_l))
        sc_ptrs = WS + e * stride_wse + cn.to(gl.int64) * stride_wsn
        scu_ptrs = sc_ptrs + up_off * stride_wsn
        for j in range(nhalves):
            s1 = j % S1
            s2 = j % S2
            sc = gl.load(sc_ptrs + j // 2)  # (an L1 hit every other half)
            mbarrier.wait(full1.index(s1), (j // S1) & 1)
            if PROBE == 2:
                mbarrier.arrive(empty1.index(s1))
                mbarrier.wait(empty2.index(s2), ((j // S2) & 1) ^ 1)
            else:
                wb = _load_bytes(w_s.index(s1), p_l)
                wbu = wb
                if GLU:
                    wbu = _load_bytes(u_s.index(s1), p_l)
                mbarrier.arrive(empty1.index(s1))  # the bytes are in registers
                g = (j % 2) * 2  # the half's first group within its 128-wide block
                mbarrier.wait(empty2.index(s2), ((j // S2) & 1) ^ 1)
                a_s.index(2 * s2).store(_widen(wb, sc, g, False, c_l))
                a_s.index(2 * s2 + 1).store(_widen(wb, sc, g + 1, True, c_l))
                if GLU:
                    scu = gl.load(scu_ptrs + j // 2)
                    au_s.index(2 * s2).store(_widen(wbu, scu, g, False, c_l))
                    au_s.index(2 * s2 + 1).store(_widen(wbu, scu, g + 1, True, c_l))
            fence_async_shared()  # the stores, then the MMAs' reads through the async proxy
            mbarrier.arrive(full2.index(s2))

    @gluon.jit
    def _mma_half(acc, acc_u, x_s, a_s, au_s, full1, full2, j, S1: gl.constexpr, S2: gl.constexpr,
                  GLU: gl.constexpr, PROBE: gl.constexpr):
        """Wait for half j's activation tiles and widened weights, issue its wgmmas asynchronously (one commit
        group each)."""
        s1 = j % S1
        s2 = j % S2
        mbarrier.wait(full1.index(s1), (j // S1) & 1)
        mbarrier.wait(full2.index(s2), (j // S2) & 1)
        fence_async_shared()  # the copies landed through the generic proxy; the MMAs read through the async one
        for sub in gl.static_range(2 if PROBE != 1 else 0):
            xt = x_s.index(2 * s1 + sub).permute((1, 0))
            acc = warpgroup_mma(a_s.index(2 * s2 + sub), xt, acc, is_async=True)
            if GLU:
                acc_u = warpgroup_mma(au_s.index(2 * s2 + sub), xt, acc_u, is_async=True)
        return acc, acc_u

    @gluon.jit
    def _wait(acc, acc_u, n: gl.constexpr, GLU: gl.constexpr):
        """warpgroup_mma_wait down to n commit groups in flight, on both accumulators (GLU) or one."""
        if GLU:
            acc, acc_u = warpgroup_mma_wait(num_outstanding=n, deps=[acc, acc_u])
        else:
            acc = warpgroup_mma_wait(num_outstanding=n, deps=[acc])
        return acc, acc_u

    @gluon.jit
    def _mma(C, SORTED, TOPK_W, x_s, a_s, au_s, full1, empty1, full2, empty2, row0, pid_n, nhalves, num_pairs,
             limit, stride_cm, valid, BM: gl.constexpr, BN: gl.constexpr, S1: gl.constexpr, S2: gl.constexpr,
             GLU: gl.constexpr, PROBE: gl.constexpr):
        """The default partition: the K loop (half 0 peeled off, so that every accumulator reaching the final
        wait comes from a wgmma: ptxas serialises them otherwise, C7515) and the epilogue (GLU: SwiGLU, z in
        sorted order; GEMM2: bf16 rows per pair)."""
        Q: gl.constexpr = 4 if GLU else 2  # commit groups per half
        NW: gl.constexpr = gl.num_warps()
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                        instr_shape=[16, BM, 16])
        acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        acc_u = gl.zeros([BN, BM], gl.float32, layout=acc_l)
        if nhalves > 0:  # (a program without a tile waits for nothing)
            acc, acc_u = _mma_half(acc, acc_u, x_s, a_s, au_s, full1, full2, 0, S1, S2, GLU, PROBE)
            acc, acc_u = _wait(acc, acc_u, Q, GLU)  # (waits for none: the loop carries tensors)
            for j in range(1, nhalves):
                acc, acc_u = _mma_half(acc, acc_u, x_s, a_s, au_s, full1, full2, j, S1, S2, GLU, PROBE)
                # half j's MMAs stay queued; half j - 1's have completed: free its slots
                acc, acc_u = _wait(acc, acc_u, Q, GLU)
                mbarrier.arrive(empty1.index((j - 1) % S1))
                mbarrier.arrive(empty2.index((j - 1) % S2))
            acc, acc_u = _wait(acc, acc_u, 0, GLU)
        store_tile(acc, acc_u, C, SORTED, TOPK_W, row0, pid_n, num_pairs, limit, stride_cm, valid, acc_l, BM, BN, GLU,
                   True)

    @gluon.jit
    def _ws_kernel(
        A, W, WS, C, SORTED, EXPERT_IDS, NUM_POST, TOPK_W,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm, TILES,
        BM: gl.constexpr, GLU: gl.constexpr, GROUP_M: gl.constexpr, LISTED: gl.constexpr, S1: gl.constexpr,
        S2: gl.constexpr, WARPS: gl.constexpr, REG_W: gl.constexpr, REG_L: gl.constexpr, WIDENERS: gl.constexpr,
        PROBE: gl.constexpr = 0,
    ):
        # weight rows per matrix: GLU 64 channels' gate rows (and their up rows), one MMA warpgroup; GEMM2 128
        BN: gl.constexpr = 64 if GLU else 128
        pid_m, pid_n = launch_order(GROUP_M)
        # a program without a tile runs an empty K loop and stores nothing (no early return: the worker
        # partitions would wait for a region that never starts)
        if LISTED:
            blk = gl.load(TILES + pid_m)
            valid = blk >= 0
            blk = gl.maximum(blk, 0)
        else:
            blk = pid_m
            valid = pid_m * BM < gl.load(NUM_POST)
        row0 = blk * (64 if LISTED else BM)
        e = gl.load(EXPERT_IDS + blk).to(gl.int64)
        nhalves = gl.where(valid, K // 64, 0)

        x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        w_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        x_s = gl.allocate_shared_memory(gl.bfloat16, [2 * S1, BM, 32], x_sl)
        w_s = gl.allocate_shared_memory(gl.uint8, [S1, BN, 32], w_sl)
        a_s = gl.allocate_shared_memory(gl.bfloat16, [2 * S2, BN, 32], x_sl)
        u_s = w_s
        au_s = a_s
        if GLU:
            u_s = gl.allocate_shared_memory(gl.uint8, [S1, BN, 32], w_sl)
            au_s = gl.allocate_shared_memory(gl.bfloat16, [2 * S2, BN, 32], x_sl)
        bar_l: gl.constexpr = mbarrier.MBarrierLayout()
        full1 = gl.allocate_shared_memory(gl.int64, [S1, 1], bar_l)
        empty1 = gl.allocate_shared_memory(gl.int64, [S1, 1], bar_l)
        full2 = gl.allocate_shared_memory(gl.int64, [S2, 1], bar_l)
        empty2 = gl.allocate_shared_memory(gl.int64, [S2, 1], bar_l)
        for s in gl.static_range(S1):
            mbarrier.init(full1.index(s), count=32 * WARPS)  # every loader thread's copies (noinc arrivals)
            mbarrier.init(empty1.index(s), count=2)  # the widener has read the bytes, the MMAs the activations
        for s in gl.static_range(S2):
            mbarrier.init(full2.index(s), count=1)
            mbarrier.init(empty2.index(s), count=1)

        gl.warp_specialize([
            (_mma, (C, SORTED, TOPK_W, x_s, a_s, au_s, full1, empty1, full2, empty2, row0, pid_n, nhalves,
                    num_pairs, limit, stride_cm, valid, BM, BN, S1, S2, GLU, PROBE)),
            (_widener, (WS, w_s, u_s, a_s, au_s, full1, empty1, full2, empty2, e, pid_n, nhalves, up_off,
                        stride_wse, stride_wsn, BN, S1, S2, GLU, PROBE)),
            (_loader, (A, W, SORTED, x_s, w_s, u_s, full1, empty1, row0, e, pid_n, nhalves, num_pairs, top_k,
                       up_off, stride_am, stride_we, stride_wn, BM, BN, S1, GLU)),
        ], [WARPS * WIDENERS, WARPS], [REG_W, REG_L])


def launch(kernel_args: tuple, grid_m: int, n: int, bm: int, glu: bool, group_m: int = 0, tiles=None):
    """`_ws_kernel` over `moe_wide.launch_args`'s arguments of the GLU (n = inter, grid (grid_m, n / 64)) or of
    GEMM2 (n = hidden, grid (grid_m, n / 128)); tiles as in `moe_wide_async.launch`. Returns the compiled kernel."""
    if bm not in (64, 128):
        raise ValueError(f"moe_wide_ws: bm must be 64 or 128, got {bm}")
    if WIDENERS not in (1, 2):
        raise ValueError(f"moe_wide_ws: WIDENERS must be 1 or 2, got {WIDENERS}")
    listed = tiles is not None
    reg_w, reg_l = REGS[glu, WIDENERS]
    return _ws_kernel[(grid_m, n // (64 if glu else 128))](
        *kernel_args, tiles if listed else kernel_args[5], BM=bm, GLU=glu, GROUP_M=group_m, LISTED=listed, S1=S1,
        S2=S2, WARPS=WARPS, REG_W=reg_w, REG_L=reg_l, WIDENERS=WIDENERS, PROBE=PROBE,
        num_warps=WARPS if glu else 2 * WARPS)
