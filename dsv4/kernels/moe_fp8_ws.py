"""The prefill MoE's FP8 GEMMs (`moe_glu_fp8`) with the copies and the weight re-encode on warps of their own (Gluon
warp specialization).

Why (docs/kernels_e2e_notes.md, session 35): in `moe_glu_fp8` all eight warps copy, re-encode and promote between
their MMAs, at 255 registers with one CTA per SM and three CTA barriers per block: 35 % issue active, 26 % tensor
pipe. Here each role has its own warps and the hand-offs are mbarriers:

    producers (4 warps   per K block kb (two producers: alternate blocks, each with its own raw ring):
      each, PRODUCERS)   cp.async of block kb + XSLOTS - WSLOTS's token codes, their scales and
                         the two weight tiles' largest bytes into an x slot (arriving on its `ready` mbarrier when
                         they land), cp.async of the packed weight bytes RAW - 1 blocks ahead into a ring of its own,
                         the re-encode of block kb into a weight slot's four e4m3 [128, 32] buffers, then `ready`
    consumers (4 warps   per K block: wait `ready`, four k32 wgmmas on their 64 rows, the scales from shared
      per 64 pairs)      memory, wait for the MMAs, release the weight slot (`free`; the x slot that the producer
                         fills next is the same block's), promote; with two consumers (BM = 128) one's promotion
                         runs under the other's MMAs

The codes are copied XSLOTS - WSLOTS blocks before their re-encode, itself up to WSLOTS blocks before their MMAs
(s40b: one ring of 4 slots for both left the consumers waiting on `ready` and on their own scale loads). The
re-encode's chain per block is the limit: an 8-warp producer was slower than a 4-warp one, two 4-warp producers
faster (docs/kernels_e2e_notes.md, session 40). Flash MoE call with the GLU and the down GEMM here (s40g, ms):
8K tokens 6.13 vs 5.92 for the default (bf16 GLU), 16K 10.93 vs 11.38. Session 41: the down GEMM alone here beats
the shared-warp one (-2 to -4 % of the call at 4K-8K, equal at 16K; Nsight 1.97 vs 2.15 ms at 8K) and is the default
(`moe_glu_fp8.WS_DOWN`); the GLU stays opt-in (`WS_GLU`: +6 % on the bf16 GLU in the 4-layer 8K forward).
The same e4m3 bytes, the same MMAs per 64 rows and block, the same promotion FMA as `moe_glu_fp8`: the outputs are
bit-identical to it (tests/gpu/test_moe_wide.py).
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

XSLOTS = 6  # blocks of token codes (+ scales) in shared memory (16 KB each at BM = 128)
WSLOTS = 3  # blocks of re-encoded weights (16 KB each)
RAW = {1: 4, 2: 3}  # a producer's ring of packed weight bytes (9 KB per block), per PRODUCERS (shared memory)
PRODUCER_WARPS = 4  # warps per producer (4 or 8)
PRODUCERS = 2  # producer partitions (2 taking alternate blocks, each with its own raw ring; or 1)
# setmaxnreg of a producer and of the second consumer per producer warps in all (the first consumer, the default
# partition, keeps what is left: the same)
REGS = {4: (152, 176), 8: (96, 160)}

if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                   warpgroup_mma_wait)

    from dsv4.kernels.moe_glu_fp8 import _code_ptrs, _copy_weights, _epilogue, _promote_tiles, _reencode, _weight_ptrs
    from dsv4.kernels.moe_wide_async import block_rows, launch_order, tile_block

    # the mbarriers, bars = (ready, free): ready[kb % XSLOTS] block kb's codes landed and weights re-encoded;
    # free[kb % WSLOTS] every consumer's MMAs on block kb done

    @gluon.jit
    def _issue_raw(w_s, v_s, w_ptrs, v_ptrs, kb, slot, nblocks):
        """cp.async of block kb's packed weights into raw slot `slot` (nothing past the end); one commit group."""
        if kb < nblocks:
            _copy_weights(w_s, v_s, w_ptrs, v_ptrs, kb, slot)
        async_copy.commit_group()

    @gluon.jit
    def _issue_x(x_s, sa_s, tb_s, bars, x_ptrs, x_mask, sa_ptrs, tb_ptrs, kb, nblocks, XSLOTS: gl.constexpr):
        """cp.async of block kb's token codes [BM, 128], their scales [BM] and the two weight tiles' largest bytes
        [2] into x slot kb % XSLOTS, arriving on its `ready` when this thread's copies have landed."""
        if kb < nblocks:
            s = kb % XSLOTS
            async_copy.async_copy_global_to_shared(x_s.index(s), x_ptrs + kb * 128, mask=x_mask)
            async_copy.async_copy_global_to_shared(sa_s.index(s), sa_ptrs + kb)
            async_copy.async_copy_global_to_shared(tb_s.index(s), tb_ptrs + kb)
            async_copy.mbarrier_arrive(bars[0].index(s), increment_count=False)

    @gluon.jit
    def _producer(src, smem, e, row0, pid_n, nblocks, BM: gl.constexpr, CH: gl.constexpr, GLU: gl.constexpr,
                  XSLOTS: gl.constexpr, WSLOTS: gl.constexpr, RAW: gl.constexpr, PART: gl.constexpr,
                  NPROD: gl.constexpr):
        """A worker partition that feeds the consumers: blocks PART, PART + NPROD, ... re-encoded (its raw ring:
        slots [PART * RAW, PART * RAW + RAW)), the codes of blocks LX further."""
        A, AS, W, WS, TB, SORTED, num_pairs, top_k, up_off, stride_am, stride_asm, stride_we, stride_wn, stride_wse, \
            stride_wsn, stride_tbe, stride_tbn = src
        x_s, sa_s, tb_s, wq, w_s, v_s, bars = smem
        NW: gl.constexpr = gl.num_warps()
        LX: gl.constexpr = XSLOTS - WSLOTS  # how far the codes' copies run ahead of the re-encode
        # the tokens' codes (4 threads per row, two 16-byte chunks each: one pointer per row and an immediate
        # offset; 8 threads per row took a pointer per chunk, 9 more SASS per block), their scales, the block's two
        # tiles' largest bytes
        x_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NW, 1], [1, 0])
        x_ptrs, x_mask = _code_ptrs(A, SORTED, row0, num_pairs, top_k, stride_am, BM, GLU, x_l)
        r_l: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        _, _, srows = block_rows(SORTED, row0, num_pairs, top_k, BM, r_l, GLU)
        sa_ptrs = AS + srows * stride_asm
        tb_ptrs = TB + e * stride_tbe + (pid_n * CH // 64 + gl.arange(0, 2, layout=r_l) * (up_off // 64)) * stride_tbn
        # the 128 weight rows (GLU: 64 gate channels, then the same 64 up channels), their scale words and tiles'
        # largest bytes, as `moe_glu_fp8` lays them out
        w_l: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [NW, 1], [1, 0])
        w_ptrs, v_ptrs = _weight_ptrs(W, WS, TB, e, pid_n, up_off, stride_we, stride_wn, stride_wse, stride_wsn,
                                      stride_tbe, stride_tbn, CH, w_l, r_l)
        c_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [NW, 1], [1, 0])  # the re-encode: a row per 2 threads

        for r in gl.static_range(RAW - 1):
            _issue_raw(w_s, v_s, w_ptrs, v_ptrs, PART + r * NPROD, PART * RAW + r, nblocks)
        for j in gl.static_range(PART, LX, NPROD):  # (in the first iteration's commit group)
            _issue_x(x_s, sa_s, tb_s, bars, x_ptrs, x_mask, sa_ptrs, tb_ptrs, j, nblocks, XSLOTS)
        for i in range((nblocks - PART + NPROD - 1) // NPROD):
            kb = PART + i * NPROD
            s = kb % WSLOTS
            # the consumers are done with block kb - WSLOTS: its weight slot and the x slot of block kb + LX (the first
            # WSLOTS blocks wait for the phase before a fresh barrier's first: no wait)
            mbarrier.wait(bars[1].index(s), (kb // WSLOTS + 1) & 1)
            _issue_x(x_s, sa_s, tb_s, bars, x_ptrs, x_mask, sa_ptrs, tb_ptrs, kb + LX, nblocks, XSLOTS)
            _issue_raw(w_s, v_s, w_ptrs, v_ptrs, kb + (RAW - 1) * NPROD, PART * RAW + (i + RAW - 1) % RAW, nblocks)
            async_copy.wait_group(RAW - 1)  # this thread's copies of block kb's weights ...
            gl.thread_barrier()  # ... and every thread's
            lo0, hi0, lo1, hi1 = _reencode(w_s, v_s, PART * RAW + i % RAW, c_l)
            wq[0].index(s).store(lo0)
            wq[1].index(s).store(hi0)
            wq[2].index(s).store(lo1)
            wq[3].index(s).store(hi1)
            fence_async_shared()
            gl.thread_barrier()  # (also: nobody reads the raw slot the next iteration refills)
            mbarrier.arrive(bars[0].index(kb % XSLOTS), count=1)
        async_copy.wait_group(0)

    @gluon.jit
    def _consumer(dst, smem, row0, pid_n, nblocks, limit, CH: gl.constexpr, GLU: gl.constexpr,
                  XSLOTS: gl.constexpr, WSLOTS: gl.constexpr, HALF: gl.constexpr):
        """A partition that multiplies rows [64 * HALF, 64 * HALF + 64) of the tile and stores their outputs."""
        C, SORTED, TOPK_W, num_pairs, stride_cm = dst
        x_s, sa_s, tb_s, wq, w_s, v_s, bars = smem
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
        zero = gl.zeros([64, 128], gl.float32, layout=acc_l)
        acc = gl.reshape(zero, [64, 2, 64])
        c_l: gl.constexpr = gl.SliceLayout(2, acc.type.layout)
        for kb in range(nblocks):
            sx = kb % XSLOTS
            sw = kb % WSLOTS
            mbarrier.wait(bars[0].index(sx), (kb // XSLOTS) & 1)
            fence_async_shared()  # (the codes came by cp.async)
            # the scales first, so that their loads land under the MMAs (s40h: the promotion's first use of them
            # waited, 7 % of the stall samples), and before the slot is released
            sa = sa_s.index(sx).slice(64 * HALF, 64).load(gl.SliceLayout(1, c_l))
            tb = tb_s.index(sx).load(gl.SliceLayout(0, c_l))
            x = x_s.index(sx).slice(64 * HALF, 64, dim=0)
            p = zero
            for j in gl.static_range(4):
                p = warpgroup_mma(x.slice(32 * j, 32, dim=1), wq[j].index(sw).permute((1, 0)), p,
                                  use_acc=j > 0, is_async=True)
            p = warpgroup_mma_wait(num_outstanding=0, deps=[p])
            gl.thread_barrier()
            mbarrier.arrive(bars[1].index(sw), count=1)
            acc = _promote_tiles(acc, p, sa, tb)
        _epilogue(acc, C, SORTED, TOPK_W, num_pairs, row0 + 64 * HALF, pid_n, limit, stride_cm, CH, GLU)

    @gluon.jit
    def _glu_fp8_ws_kernel(
        A, AS, W, WS, TB, C, SORTED, EXPERT_IDS, NUM_POST, TOPK_W, TILES,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_asm, stride_we, stride_wn, stride_wse, stride_wsn, stride_tbe, stride_tbn, stride_cm,
        BM: gl.constexpr, XSLOTS: gl.constexpr, WSLOTS: gl.constexpr, RAW: gl.constexpr, GROUP_M: gl.constexpr,
        LISTED: gl.constexpr, GLU: gl.constexpr, PRODUCER_WARPS: gl.constexpr, PRODUCERS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    ):
        # `moe_glu_fp8._glu_fp8_kernel`'s arguments and tiles (GLU: 64 gate + 64 up channels; else 128 outputs)
        CH: gl.constexpr = 64 if GLU else 128
        pid_m, pid_n = launch_order(GROUP_M)
        blk, row0, live = tile_block(TILES, NUM_POST, pid_m, BM, LISTED)
        if live:
            e = gl.load(EXPERT_IDS + blk).to(gl.int64)
            nblocks = K // 128
            x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
            g_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)
            v_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
            x_s = gl.allocate_shared_memory(gl.float8e4nv, [XSLOTS, BM, 128], x_sl)
            sa_s = gl.allocate_shared_memory(gl.float32, [XSLOTS, BM], v_sl)
            tb_s = gl.allocate_shared_memory(gl.int32, [XSLOTS, 2], v_sl)
            # one allocation per 32-wide group: Triton's barrier analysis takes stores to one allocation for
            # overlapping ones and put a partition barrier between the four (s40: three per block)
            wq = (gl.allocate_shared_memory(gl.float8e4nv, [WSLOTS, 128, 32], g_sl),
                  gl.allocate_shared_memory(gl.float8e4nv, [WSLOTS, 128, 32], g_sl),
                  gl.allocate_shared_memory(gl.float8e4nv, [WSLOTS, 128, 32], g_sl),
                  gl.allocate_shared_memory(gl.float8e4nv, [WSLOTS, 128, 32], g_sl))
            NR: gl.constexpr = RAW * PRODUCERS  # (each producer's raw ring)
            w_s = gl.allocate_shared_memory(gl.uint8, [NR, 128, 64], gl.SwizzledSharedLayout(32, 2, 2, order=[1, 0]))
            v_s = (gl.allocate_shared_memory(gl.int32, [NR, 128], v_sl),
                   gl.allocate_shared_memory(gl.int32, [NR, 128], v_sl))
            bars = (gl.allocate_shared_memory(gl.int64, [XSLOTS, 1], mbarrier.MBarrierLayout()),
                    gl.allocate_shared_memory(gl.int64, [WSLOTS, 1], mbarrier.MBarrierLayout()))
            for s in gl.static_range(XSLOTS):
                mbarrier.init(bars[0].index(s), count=32 * PRODUCER_WARPS + 1)  # its copy arrivals + re-encode
            for s in gl.static_range(WSLOTS):
                mbarrier.init(bars[1].index(s), count=BM // 64)  # one per consumer
            smem = (x_s, sa_s, tb_s, wq, w_s, v_s, bars)
            src = (A, AS, W, WS, TB, SORTED, num_pairs, top_k, up_off, stride_am, stride_asm, stride_we, stride_wn,
                   stride_wse, stride_wsn, stride_tbe, stride_tbn)
            dst = (C, SORTED, TOPK_W, num_pairs, stride_cm)
            # (constexprs inline: a tuple assigned to a name first turns them into tensors)
            if BM == 128 and PRODUCERS == 2:
                gl.warp_specialize([(_consumer, (dst, smem, row0, pid_n, nblocks, limit, CH, GLU, XSLOTS, WSLOTS, 0)),
                                    (_consumer, (dst, smem, row0, pid_n, nblocks, limit, CH, GLU, XSLOTS, WSLOTS, 1)),
                                    (_producer, (src, smem, e, row0, pid_n, nblocks, BM, CH, GLU, XSLOTS, WSLOTS, RAW,
                                                 0, 2)),
                                    (_producer, (src, smem, e, row0, pid_n, nblocks, BM, CH, GLU, XSLOTS, WSLOTS, RAW,
                                                 1, 2))],
                                   [4, PRODUCER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
            elif BM == 128:
                gl.warp_specialize([(_consumer, (dst, smem, row0, pid_n, nblocks, limit, CH, GLU, XSLOTS, WSLOTS, 0)),
                                    (_consumer, (dst, smem, row0, pid_n, nblocks, limit, CH, GLU, XSLOTS, WSLOTS, 1)),
                                    (_producer, (src, smem, e, row0, pid_n, nblocks, BM, CH, GLU, XSLOTS, WSLOTS, RAW,
                                                 0, 1))], [4, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])
            elif PRODUCERS == 2:
                gl.warp_specialize([(_consumer, (dst, smem, row0, pid_n, nblocks, limit, CH, GLU, XSLOTS, WSLOTS, 0)),
                                    (_producer, (src, smem, e, row0, pid_n, nblocks, BM, CH, GLU, XSLOTS, WSLOTS, RAW,
                                                 0, 2)),
                                    (_producer, (src, smem, e, row0, pid_n, nblocks, BM, CH, GLU, XSLOTS, WSLOTS, RAW,
                                                 1, 2))],
                                   [PRODUCER_WARPS, PRODUCER_WARPS], [PRODUCER_REGS, PRODUCER_REGS])
            else:
                gl.warp_specialize([(_consumer, (dst, smem, row0, pid_n, nblocks, limit, CH, GLU, XSLOTS, WSLOTS, 0)),
                                    (_producer, (src, smem, e, row0, pid_n, nblocks, BM, CH, GLU, XSLOTS, WSLOTS, RAW,
                                                 0, 1))], [PRODUCER_WARPS], [PRODUCER_REGS])


def launch_ws(args: tuple, grid: tuple, bm: int, group_m: int, listed: bool, glu: bool):
    """`moe_glu_fp8.launch`'s kernel arguments through the warp-specialized kernel. Returns the compiled kernel."""
    producer_regs, consumer_regs = REGS[PRODUCER_WARPS * PRODUCERS]
    return _glu_fp8_ws_kernel[grid](*args, BM=bm, XSLOTS=XSLOTS, WSLOTS=WSLOTS, RAW=RAW[PRODUCERS],
                                    GROUP_M=group_m, LISTED=listed, GLU=glu, PRODUCER_WARPS=PRODUCER_WARPS,
                                    PRODUCERS=PRODUCERS, PRODUCER_REGS=producer_regs, CONSUMER_REGS=consumer_regs,
                                    num_warps=4)
