"""The prefill MoE's bf16 GLU (`moe_wide_async`'s) with the weight widening on warps of their own (Gluon warp
specialization), the structure of `moe_fp8_ws` without its FP8 promotion.

Why (docs/kernels_e2e_notes.md, sessions 28, 29, 40, 41): the default GLU widens MXFP4 to bf16 in the MMA warps and
feeds the tensor cores from registers, one step in flight (ptxas serialises a register operand defined under an
earlier MMA): ≈ 58 % of the bf16 pipe. Session 29's warp-specialized version had one widening warpgroup on 64-token
tiles and lost (its partitions added up). Here, per the FP8 kernel's lessons: two producer partitions take
alternate 64-wide K halves (each with its own ring of packed bytes), the tile is 128 tokens x 128 gate + 128 up
channels (each widened weight serves 128 tokens, the activations are read by half as many programs), and the
consumers only issue MMAs -- bf16 products of exact operands sum in fp32 over all of K, so there is nothing to
promote. Per 64-wide half and SM: ≈ 1,024 tensor cycles against ≈ 350 issue slots of one producer warp and ≈ 50 of
each consumer warp per scheduler.

    producers (4 warps   per half j (two producers: alternate halves, so producer p widens groups 2p and 2p + 1
      each)              of every 128-wide block): cp.async of half j + XSLOTS - WSLOTS's activations into an x
                         slot (arriving on its `ready` mbarrier when they land), cp.async of its packed weight
                         bytes and scale words RAW - 1 halves ahead into a ring of its own, the widening of half j
                         (`moe_wide_async._load_bytes` / `_widen`, the default GLU's bits) into a weight slot's four
                         [128, 32] bf16 buffers (gate lo / hi group, up lo / hi group), then `ready`
    consumers (4 warps   per half: wait `ready`, its four MMAs (gate, up x two 32-wide groups) on its 64 gate and
      per 64 channels)   64 up rows, then wait for the previous half's MMAs and release its weight slot (`free`)

z is stored unquantised (the narrow tiles' path of `moe_wide`: `requant_rows` quantises it per 128 channels for a
bf16 down GEMM; the FP8 down GEMM quantises it itself). The products and the order of the MMAs over K are the
default GLU's, so z is bit-identical to it (tests/gpu/test_moe_wide.py). Opt-in: `moe_wide.WS_BF16_GLU`.
"""
from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON

XSLOTS = 4  # halves of activations in shared memory (bf16 [128, 64]: 16 KB each)
WSLOTS = 3  # halves of widened weights (bf16 [256, 64]: 32 KB each)
RAW = 2  # a producer's ring of packed weight bytes and scale words per half (≈ 9 KB each)
# consumers wait for each half's own MMAs before releasing its slots (True), or keep one half in flight and release
# the previous one (False)
WAIT_OWN = False
PRODUCERS = 2  # producer partitions (2: alternate halves, each with its own raw ring; or 1)
# setmaxnreg of a producer and of the second consumer per producer warps in all (the first consumer, the default
# partition, keeps what is left: the same)
REGS = {4: (152, 176), 8: (88, 168)}  # (8: 96 / 160 spills 176 B; 104 / 152 spills the consumers)

if HAS_TRITON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                   warpgroup_mma_wait)

    from dsv4.kernels.moe_wide_async import (_load_bytes, _widen, block_rows, launch_order, store_tile,
                                             tile_block)

    # the mbarriers, bars = (ready, free): ready[j % XSLOTS] half j's activations landed and weights widened;
    # free[j % WSLOTS] every consumer's MMAs on half j done

    @gluon.jit
    def _issue_raw(w_s, v_s, w_ptrs, v_ptrs, up_w, up_v, j, slot, nhalves):
        """cp.async of half j's packed gate and up bytes [128, 32] each and their rows' scale words into raw slot
        `slot` (nothing past the end); one commit group."""
        if j < nhalves:
            async_copy.async_copy_global_to_shared(w_s[0].index(slot), w_ptrs + j * 32)
            async_copy.async_copy_global_to_shared(w_s[1].index(slot), w_ptrs + up_w + j * 32)
            async_copy.async_copy_global_to_shared(v_s[0].index(slot), v_ptrs + j // 2)
            async_copy.async_copy_global_to_shared(v_s[1].index(slot), v_ptrs + up_v + j // 2)
        async_copy.commit_group()

    @gluon.jit
    def _issue_x(x_s, bars, x_ptrs, x_mask, j, nhalves, XSLOTS: gl.constexpr):
        """cp.async of half j's activations (two [BM, 32] tiles) into x slot j % XSLOTS, arriving on its `ready`
        when this thread's copies have landed."""
        if j < nhalves:
            s = j % XSLOTS
            async_copy.async_copy_global_to_shared(x_s.index(2 * s), x_ptrs + j * 64, mask=x_mask)
            async_copy.async_copy_global_to_shared(x_s.index(2 * s + 1), x_ptrs + j * 64 + 32, mask=x_mask)
            async_copy.mbarrier_arrive(bars[0].index(s), increment_count=False)

    @gluon.jit
    def _producer(src, smem, e, row0, pid_n, nhalves, BM: gl.constexpr, XSLOTS: gl.constexpr,
                  WSLOTS: gl.constexpr, RAW: gl.constexpr, PERM: gl.constexpr, PART: gl.constexpr,
                  NPROD: gl.constexpr):
        """A worker partition that feeds the consumers: halves PART, PART + NPROD, ... widened (its raw ring:
        slots [PART * RAW, PART * RAW + RAW)), the activations of halves LX further."""
        A, W, WS, SORTED, num_pairs, top_k, up_off, stride_am, stride_we, stride_wn, stride_wse, stride_wsn = src
        x_s, wq, w_s, v_s, bars = smem
        NW: gl.constexpr = gl.num_warps()
        LX: gl.constexpr = XSLOTS - WSLOTS  # how far the activations' copies run ahead of the widening
        x_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [NW, 1], [1, 0])  # 16 bytes per thread
        _, xvalid, rows = block_rows(SORTED, row0, num_pairs, top_k, BM, gl.SliceLayout(1, x_l), True)
        xk = gl.arange(0, 32, layout=gl.SliceLayout(0, x_l))
        x_ptrs = A + rows[:, None] * stride_am + xk[None, :]
        x_mask = xvalid[:, None] & (xk[None, :] < 32)
        # the 128 gate rows' packed bytes (16 per thread) and scale words; the up rows are up_off rows further
        c_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [NW, 1], [1, 0])
        cn = pid_n * 128 + gl.arange(0, 128, layout=gl.SliceLayout(1, c_l))
        ck = gl.arange(0, 32, layout=gl.SliceLayout(0, c_l))
        w_ptrs = W + e * stride_we + cn[:, None].to(gl.int64) * stride_wn + ck[None, :]
        v_l: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        v_ptrs = (WS + e * stride_wse) + (pid_n * 128 + gl.arange(0, 128, layout=v_l)) * stride_wsn
        up_w = up_off * stride_wn
        up_v = up_off * stride_wsn
        p_l: gl.constexpr = gl.BlockedLayout([1, 8], [16, 2], [NW, 1], [1, 0])  # c_l in k-pair words

        for r in gl.static_range(RAW - 1):
            _issue_raw(w_s, v_s, w_ptrs, v_ptrs, up_w, up_v, PART + r * NPROD, PART * RAW + r, nhalves)
        for jx in gl.static_range(PART, LX, NPROD):  # (in the first iteration's commit group)
            _issue_x(x_s, bars, x_ptrs, x_mask, jx, nhalves, XSLOTS)
        for i in range((nhalves - PART + NPROD - 1) // NPROD):
            j = PART + i * NPROD
            s = j % WSLOTS
            # the consumers are done with half j - WSLOTS: its weight slot and the x slot of half j + LX (the first
            # WSLOTS halves wait for the phase before a fresh barrier's first: no wait)
            mbarrier.wait(bars[1].index(s), (j // WSLOTS + 1) & 1)
            _issue_x(x_s, bars, x_ptrs, x_mask, j + LX, nhalves, XSLOTS)
            _issue_raw(w_s, v_s, w_ptrs, v_ptrs, up_w, up_v, j + (RAW - 1) * NPROD,
                       PART * RAW + (i + RAW - 1) % RAW, nhalves)
            async_copy.wait_group(RAW - 1)  # this thread's copies of half j's weights ...
            gl.thread_barrier()  # ... and every thread's
            rs = PART * RAW + i % RAW
            g = (j % 2) * 2  # the half's first group within its 128-wide block
            wb = _load_bytes(w_s[0].index(rs), p_l, PERM)
            sc = v_s[0].index(rs).load(gl.SliceLayout(1, p_l))
            wq[0].index(s).store(_widen(wb, sc, g, False, c_l))
            wq[1].index(s).store(_widen(wb, sc, g + 1, True, c_l))
            wb = _load_bytes(w_s[1].index(rs), p_l, PERM)
            sc = v_s[1].index(rs).load(gl.SliceLayout(1, p_l))
            wq[2].index(s).store(_widen(wb, sc, g, False, c_l))
            wq[3].index(s).store(_widen(wb, sc, g + 1, True, c_l))
            fence_async_shared()
            gl.thread_barrier()  # (also: nobody reads the raw slot the next iteration refills)
            mbarrier.arrive(bars[0].index(j % XSLOTS), count=1)
        async_copy.wait_group(0)

    @gluon.jit
    def _mma_half(acc, acc_u, x_s, wq, j, HALF: gl.constexpr, XSLOTS: gl.constexpr, WSLOTS: gl.constexpr):
        """Half j's MMAs on this consumer's 64 gate and 64 up rows, issued asynchronously (four commit groups)."""
        sx = j % XSLOTS
        sw = j % WSLOTS
        for sub in gl.static_range(2):
            xt = x_s.index(2 * sx + sub).permute((1, 0))
            acc = warpgroup_mma(wq[sub].index(sw).slice(64 * HALF, 64), xt, acc, is_async=True)
            acc_u = warpgroup_mma(wq[2 + sub].index(sw).slice(64 * HALF, 64), xt, acc_u, is_async=True)
        return acc, acc_u

    @gluon.jit
    def _consumer(dst, smem, row0, pid_n, nhalves, limit, BM: gl.constexpr, XSLOTS: gl.constexpr,
                  WSLOTS: gl.constexpr, STORE_T: gl.constexpr, WAIT_OWN: gl.constexpr, HALF: gl.constexpr):
        """A partition that multiplies gate and up channels [64 * HALF, 64 * HALF + 64) of the tile and stores their
        z. Half 0 is peeled off the loop so that every accumulator reaching a wait comes from a wgmma (C7515)."""
        C, SORTED, TOPK_W, num_pairs, stride_cm = dst
        x_s, wq, w_s, v_s, bars = smem
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 16])
        acc = gl.zeros([64, BM], gl.float32, layout=acc_l)
        acc_u = gl.zeros([64, BM], gl.float32, layout=acc_l)
        mbarrier.wait(bars[0].index(0), 0)
        fence_async_shared()  # (the activations came by cp.async)
        acc, acc_u = _mma_half(acc, acc_u, x_s, wq, 0, HALF, XSLOTS, WSLOTS)
        if WAIT_OWN:
            acc, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=[acc, acc_u])
            gl.thread_barrier()
            mbarrier.arrive(bars[1].index(0), count=1)
        else:  # (waits for nothing: the loop carries the accumulators as tensors)
            acc, acc_u = warpgroup_mma_wait(num_outstanding=4, deps=[acc, acc_u])
        for j in range(1, nhalves):
            mbarrier.wait(bars[0].index(j % XSLOTS), (j // XSLOTS) & 1)
            fence_async_shared()
            acc, acc_u = _mma_half(acc, acc_u, x_s, wq, j, HALF, XSLOTS, WSLOTS)
            if WAIT_OWN:  # (the other consumer's MMAs keep the tensor cores busy meanwhile)
                acc, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=[acc, acc_u])
                gl.thread_barrier()
                mbarrier.arrive(bars[1].index(j % WSLOTS), count=1)
            else:
                acc, acc_u = warpgroup_mma_wait(num_outstanding=4, deps=[acc, acc_u])
                gl.thread_barrier()  # half j - 1's MMAs are done in every warp: its slots are free
                mbarrier.arrive(bars[1].index((j - 1) % WSLOTS), count=1)
        acc, acc_u = warpgroup_mma_wait(num_outstanding=0, deps=[acc, acc_u])
        store_tile(acc, acc_u, C, SORTED, TOPK_W, row0, 2 * pid_n + HALF, num_pairs, limit, stride_cm, True, acc_l,
                   BM, 64, True, False, STORE_T)

    @gluon.jit
    def _glu_bf16_ws_kernel(
        A, W, WS, C, SORTED, EXPERT_IDS, NUM_POST, TOPK_W,
        K, num_pairs, top_k, up_off, limit,
        stride_am, stride_we, stride_wn, stride_wse, stride_wsn, stride_cm, TILES,
        BM: gl.constexpr, XSLOTS: gl.constexpr, WSLOTS: gl.constexpr, RAW: gl.constexpr, GROUP_M: gl.constexpr,
        LISTED: gl.constexpr, PERM: gl.constexpr, STORE_T: gl.constexpr, PRODUCERS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, WAIT_OWN: gl.constexpr,
    ):
        # `moe_wide_async._wide_async_kernel`'s arguments (the GLU's); 128 gate + 128 up channels per program
        pid_m, pid_n = launch_order(GROUP_M)
        blk, row0, live = tile_block(TILES, NUM_POST, pid_m, BM, LISTED)
        if live:
            e = gl.load(EXPERT_IDS + blk).to(gl.int64)
            nhalves = K // 64
            x_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
            x_s = gl.allocate_shared_memory(gl.bfloat16, [2 * XSLOTS, BM, 32], x_sl)
            # one allocation per (gate / up, group): Triton's barrier analysis takes stores to one allocation for
            # overlapping ones and puts a partition barrier between them (session 40)
            wq = (gl.allocate_shared_memory(gl.bfloat16, [WSLOTS, 128, 32], x_sl),
                  gl.allocate_shared_memory(gl.bfloat16, [WSLOTS, 128, 32], x_sl),
                  gl.allocate_shared_memory(gl.bfloat16, [WSLOTS, 128, 32], x_sl),
                  gl.allocate_shared_memory(gl.bfloat16, [WSLOTS, 128, 32], x_sl))
            NR: gl.constexpr = RAW * PRODUCERS  # (each producer's raw ring)
            raw_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
            v_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
            w_s = (gl.allocate_shared_memory(gl.uint8, [NR, 128, 32], raw_sl),
                   gl.allocate_shared_memory(gl.uint8, [NR, 128, 32], raw_sl))
            v_s = (gl.allocate_shared_memory(gl.int32, [NR, 128], v_sl),
                   gl.allocate_shared_memory(gl.int32, [NR, 128], v_sl))
            bars = (gl.allocate_shared_memory(gl.int64, [XSLOTS, 1], mbarrier.MBarrierLayout()),
                    gl.allocate_shared_memory(gl.int64, [WSLOTS, 1], mbarrier.MBarrierLayout()))
            for s in gl.static_range(XSLOTS):
                mbarrier.init(bars[0].index(s), count=32 * 4 + 1)  # its copy arrivals + the widening
            for s in gl.static_range(WSLOTS):
                mbarrier.init(bars[1].index(s), count=2)  # one per consumer
            smem = (x_s, wq, w_s, v_s, bars)
            src = (A, W, WS, SORTED, num_pairs, top_k, up_off, stride_am, stride_we, stride_wn, stride_wse,
                   stride_wsn)
            dst = (C, SORTED, TOPK_W, num_pairs, stride_cm)
            # (constexprs inline: a tuple assigned to a name first turns them into tensors)
            if PRODUCERS == 2:
                gl.warp_specialize([(_consumer, (dst, smem, row0, pid_n, nhalves, limit, BM, XSLOTS, WSLOTS, STORE_T,
                                                 WAIT_OWN, 0)),
                                    (_consumer, (dst, smem, row0, pid_n, nhalves, limit, BM, XSLOTS, WSLOTS, STORE_T,
                                                 WAIT_OWN, 1)),
                                    (_producer, (src, smem, e, row0, pid_n, nhalves, BM, XSLOTS, WSLOTS, RAW, PERM,
                                                 0, 2)),
                                    (_producer, (src, smem, e, row0, pid_n, nhalves, BM, XSLOTS, WSLOTS, RAW, PERM,
                                                 1, 2))],
                                   [4, 4, 4], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])
            else:
                gl.warp_specialize([(_consumer, (dst, smem, row0, pid_n, nhalves, limit, BM, XSLOTS, WSLOTS, STORE_T,
                                                 WAIT_OWN, 0)),
                                    (_consumer, (dst, smem, row0, pid_n, nhalves, limit, BM, XSLOTS, WSLOTS, STORE_T,
                                                 WAIT_OWN, 1)),
                                    (_producer, (src, smem, e, row0, pid_n, nhalves, BM, XSLOTS, WSLOTS, RAW, PERM,
                                                 0, 1))], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


def launch(kernel_args: tuple, rows: int, group_m: int, tiles=None, perm: int = 0, store_t: bool = True):
    """The GLU of `moe_wide.launch_args`'s args1 (`_wide_async_kernel`'s order) on rows programs of 128-row tiles
    (tiles: int32 [rows] of 64-row blocks, as `moe_wide_async.launch`; else block i of a 128-row alignment) x
    inter / 128 channel tiles; z unquantised. Returns the compiled kernel."""
    inter = kernel_args[3].shape[1]
    if inter % 128 or kernel_args[8] % 128:
        raise ValueError(f"moe_bf16_ws: inter {inter} and hidden {kernel_args[8]} must be multiples of 128")
    producer_regs, consumer_regs = REGS[4 * PRODUCERS]
    listed = tiles is not None
    return _glu_bf16_ws_kernel[(rows, inter // 128)](
        *kernel_args, tiles if listed else kernel_args[5], BM=128, XSLOTS=XSLOTS, WSLOTS=WSLOTS, RAW=RAW,
        GROUP_M=group_m, LISTED=listed, PERM=perm, STORE_T=store_t, PRODUCERS=PRODUCERS,
        PRODUCER_REGS=producer_regs, CONSUMER_REGS=consumer_regs, WAIT_OWN=WAIT_OWN, num_warps=4)
