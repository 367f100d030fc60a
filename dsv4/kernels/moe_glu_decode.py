"""The decode MoE's GLU (GEMM1 of `moe_gemv` method "mma", one pair per work unit) as a persistent Gluon kernel
with a producer warp: the weight stream never stops between units.

Why (docs/kernels_e2e_notes.md, sessions 19, 24, 42-46): the Triton GLU at B = 1 streams ≈ 50 MB in ≈ 28 µs
(≈ 1.8 TB/s of the H200's ≈ 3.9-4.3): 3 CTAs per SM at 16 % warps active, and each program's pipeline fills and
drains for its 64 rows and half of K. Here one program per SM walks a list of work units (pair, 64-row tile, K
range); the partitions share a ring of STAGES shared-memory slots:

    producer (1 warp)       per unit step (2 K blocks): waits for a free slot, then TMA of the gate and up rows'
                            weight bytes (4 boxes of [64 rows, 64 bytes], 64-byte swizzle) and of their E8M0 scale
                            bytes (the 16-byte aligned run holding the step's 8, per row) -- it runs up to STAGES
                            steps ahead, into the next unit while the consumers finish this one
    consumers (CONSUMERS    the math of method "mma" (`moe_gemv`'s docstring), alternate steps of every unit each:
      x 4 warps)            the bytes read from the slot in the K order of `_mma_order` (two 8-byte runs per thread,
                            row and K block), the nibbles moved into f16 (e2m1 * 2^-14, exact), wgmma (m64n8k16, the
                            weights as the register operand) against the block-diagonal activation tiles of the
                            pair's token (built in shared memory from the router's x quantisation when the token
                            changes, from one batched load), the slot freed once the MMAs are done, each step's 8
                            columns scaled by group and activation scales (the latter from L1) into the fp32
                            accumulators; per unit the [64] gate / up row sums stored as the fp32 partial of its K
                            range and consumer

`_finish_kernel` then sums the S x CONSUMERS partials in order, applies the SwiGLU epilogue (bf16 gate / up, clamp,
routing weight) and quantises z per 128 channels as W2's input (`mma_down_stage`'s layout): the work of the Triton
GLU's split-K last arriver plus `_quant16_kernel`, without arrival counters. (FINISH_IN_DOWN, opt-in: the down's
consumers do it instead, each for the blocks it reads.)

The down GEMV (GEMM2, `down_decode`, DOWN_ENABLED: on where it fits) is the same kernel with one matrix per unit
(W2's rows, from z's codes; a program takes a run of one pair's row tiles, CONTIG, so it rebuilds its activation
tiles once per pair); its fp32 partials are summed per row, rounded to bf16 and combined by `moe_combine.combine`
in one launch.

Numerics: the same exact products and per-group fp32 sums as method "mma" (one MMA chain per 32-group and step,
scaled in the same order); the row sums over the accumulator's 8 columns and the K ranges run in another order
than the Triton GLU's 16-column sum -- yet every z and MoE output came out bit-identical to it (s47c;
tests/gpu/test_moe_glu_decode.py checks closeness and prints the bit-identical share).

The kernel is launched with PDL: barrier set-up overlaps the previous kernel's tail, and the finish is scheduled
beside it to wait.

Hopper notes met here (s47): a TMA box whose start is not 16-byte aligned in the inner dimension faulted with "illegal
instruction" (the scale boxes started 8 bytes into a 16-byte run); with one consumer Triton's register bound for
the 8-warp launch (256) is past ptxas's 255, ignored, and the partitions' setmaxnreg then fault too
(ONE_CONSUMER_MAXNREG). One consumer warpgroup is issue-bound (≈ 550 SASS instructions per 16 KB step per thread,
no other warp on its schedulers to fill the stalls): the second is what makes it pay. Nsight (s48): the top stall
"barrier" is the idle warps of the producer's warpgroup and the partitions' end (fewer CTA barriers in the step loop
changed nothing); the per-tile activation loads were a chain of L2 round trips at the start (14 % of the stall
samples, now one batched load: GLU alone at one token 24.8 -> 23.3 µs).
"""
from __future__ import annotations

import functools

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET
from dsv4.kernels.moe_layout import BLOCK, PackedExperts
from dsv4.kernels.moe_glu_decode_parts import U  # K blocks per step (the kernels' helpers share it)

# The decode GLU here where it applies (`applies`). Session 47 (s47c, H200, Flash MoE call in CUDA graphs of 16
# routings, bench_moe_flags.py --graphs 16, µs; Triton GLU / this one with 1 consumer / with 2): M = 1 45.6 / 48.9 /
# 45.1, M = 2 72.2 / 76.0 / 66.7, M = 4 129.4 / 135.9 / 115.5, every output bit-identical; 8-layer B = 1 graph
# replay 1.19 (2 consumers) vs 1.20 ms. Session 48 (batched activation load, PDL): M = 1 / 2 / 4 40.9 / 65.5 / 113.9
# vs the Triton GLU's 45.2 / 71.4 / 128.7 µs in the same run; 8-layer B = 1 replay 1.17 ms
ENABLED = True
# Session 78 (s78g, H100, Flash MoE call in graphs of 16 routings, two alternating rounds): 4 slots and 2 K ranges
# instead of 6 and 4 -- M = 1 42.9 / 43.1 -> 40.7 / 40.8 µs, 2 72.7 -> 69.5, 4 129.6 -> 126.7, 8 242.7 -> 236.7, 11
# 318.2 -> 307.5 (2 ranges alone: 42.5, 71.3, 127.9, 237.8, 310.0), outputs bit-identical; 8 Flash layers' replay
# B = 1 1.16 / 1.15 either way, B = 8 3.11 / 3.12 -> 3.08 / 3.07 ms
STAGES = 4  # ring slots of one unit step each (2 K blocks: 16 KB of weight bytes; a multiple of CONSUMERS)
SPLIT = 2  # K ranges per (pair, row tile): units small enough to share out evenly over the SMs
CONSUMERS = 2  # consumer warpgroups (alternate steps of every unit, each with its own partial; 1: slower, above)
# setmaxnreg of the second consumer (the first takes 256, the producer warp's warpgroup 40: within the pool of
# Triton's 168 registers x 384 threads; 232 would not fit and the allocation would wait forever)
CONSUMER_REGS = 200
# one consumer: the launch's register bound (Triton's default, 65536 / 256 threads = 256, is past ptxas's 255 and
# ignored, and the setmaxnreg of the partitions then fault: "illegal instruction", s47c)
ONE_CONSUMER_MAXNREG = 232
# The down GEMV here too: the same kernel over W2's rows, each unit's activation tiles the pair's own z, a
# program's units a run of one pair's row tiles (CONTIG), y's partials summed in the combine (`moe_combine.combine`
# given them as 3-D y: no launch of its own; its producer streams W2 before the PDL wait, only its consumers wait for
# z). Session 48: faster alone than the Triton down (one token 13.1 vs 18.3 µs, bench_moe_stages); in the MoE call
# only once the combine over its partials took 256-column programs (`moe_combine.COMBINE_PARTIALS_BD`): M = 1 / 2 / 4
# 37.2 / 61.6 / 110.0 µs (DOWN_SPLIT 1; 2: 37.4 / 62.7 / 112.3) vs 40.7 / 65.4 / 113.1. On since session 49: the
# model-level GPU suite passes with it (218 of 219; the other failed the same with it off, on one machine only), 8
# Flash layers' B = 1 replay 1.14-1.15 vs 1.18 ms off, alternating. Pro's 3072 does not fit (`_fits`): Triton there.
DOWN_ENABLED = True
# Tried and removed (sessions 80-81): the GLU, its finish and the down chained in one persistent launch (each z block
# finished in the kernel by its last arriving partial through gpu-scope counters, a pair's down units started once
# its 16 blocks were in, the producer streaming W2 on from w13). Bit-identical, but slower at every M on the H100 (in
# graphs of 16 routings): with the counts taken by the consumers 41.6 -> 47.2 µs at M = 1, 240.6 -> 284.4 at M = 8;
# with a one-warp signal partition counting them 40.8 -> 42.7 (M = 1), 69.5 -> 72.8 (2), 126.0 -> 132.9 (4), 233.1
# -> 238.6 (8). Every pair's z completes only in the GLU's last round (its units are strided over the programs), so
# the chain can save the finish launch and the down's ramp at most, and its waits and counters cost more.
# Also removed (sessions 82-84): a step's second K block on MMA chains of its own, in the down and in the GLU (same
# bits). Session 84 (H100, two rounds): M = 1 40.8 / 40.6 / 40.8 / 40.7 µs (one chain / down / GLU / both), M = 8
# 233.3 / 233.1 / 232.8 / 232.4, all within 0.5 %; 8 Flash layers' B = 1 replay 1.16 / 1.15 ms either way.
# Register bounds of the two launches (two consumers): None, Triton's 168 per thread x 384 threads = 64,512 of the
# SM's 65,536, so no CTA of another kernel fits beside one of theirs; else (maxnreg, the second consumer's setmaxnreg),
# the first consumer taking what is left (Triton). At one token the GLU's finish (32 registers x 128 threads = 4,096)
# runs between the two: on the SMs where one runs, the down's CTA starts only after it, and its producer's pre-wait
# W2 ring (48 KB per SM) fills only then. The shared expert's one-row GEMVs beside them (w13 48 registers, its down
# 124, x 128 threads) fit nowhere while the GLU or the down holds an SM (session 80's time line: its SwiGLU started
# only as the GLU ended, its down GEMV overlapped the finish and the routed down's start). The down at (160, 200)
# leaves room for one finish CTA (partitions 240 / 200 / 40), at (128, 136) for one of those GEMV CTAs (208 / 136 /
# 40); the GLU at (136, 184) for two w13 GEMV CTAs (184 / 184 / 40). Offline (`sass_stats moe_*_decode_b*`): no
# spills; at other pairs ptxas spills or serialises the GLU's wgmmas ((152, 168): 40 B; (128, 136-152): serialised).
# Session 85 (H100): both bounds together, the MoE call 40.8 -> 39.3-39.9 us at M = 1 (-2 %), -0.8 % at M = 8, bits
# unchanged; 8 layers' B = 1 rows 1.15 -> 1.14-1.15 ms, B = 8 ties. None (Triton's bound) stays an option.
GLU_BOUND: tuple[int, int] | None = (136, 184)
DOWN_BOUND: tuple[int, int] | None = (128, 136)
# The GLU's finish done by the down's consumers instead (opt-in, session 85, not measured yet): each builds z's
# blocks of its steps from the GLU's fp32 partials (`moe_glu_decode_parts._finish_blocks`: the finish's math, so the
# same bits), stores them to zq / zs and reads them back as before -- one launch and one z hand-off fewer per MoE
# call, for 32 KB of L2 reads per consumer and pair it builds (every program of a pair re-sums its partials; at one
# token ≈ 2-3 pairs' builds per program). Session 80's time line: the finish took ≈ 4 µs of M = 1's ≈ 40.
FINISH_IN_DOWN = False
DOWN_STAGES = 6  # ... its ring slots (8 KB each; a multiple of CONSUMERS: 5 faulted, s78f)
DOWN_SPLIT = 1  # ... its K ranges (inter 2048: 16 steps per range, 8 per consumer)
# the GLU where SPLIT does not fit the hidden size (Pro's 7168 = 56 K blocks, 14 steps of 2 per consumer pair): the
# most K ranges up to ODD_SPLIT_MAX that do (7). Session 49: Pro's MoE call M = 1 / 2 / 4 84.0 / 146.7 / 269.8 µs vs
# 108.3 / 181.7 / 312.7 (the Triton GLU); 4 Pro layers' B = 1 replay 1.15 vs 1.24 ms
ODD_SPLIT = True
ODD_SPLIT_MAX = 8  # (twice session 49's SPLIT, fixed when SPLIT went to 2: Pro's 7 ranges stay in reach)
# the down where DOWN_SPLIT does not fit the inter size (Pro's 3072 = 24 K blocks in one range: not a power of two,
# `_fits`): the fewest K ranges from DOWN_SPLIT up to ODD_SPLIT_MAX that do (3 of 8 blocks; the down liked fewer ranges,
# session 48). Session 49: its tests pass; Pro's MoE call M = 1 / 2 / 4 80.6-81.0 / 148.8-149.0 / 272.3-272.7 µs vs
# 84.0-84.2 / 146.9-147.1 / 269.5-269.6 (the Triton down): −4 % at one token, +1 % from two. Session 50, 4 Pro
# layers' graph replay off / on: B = 1 1.11 / 1.11 ms, B = 2 1.84 / 1.72 (one pair: noisy). Opt-in: no gain at B = 1
DOWN_ODD_SPLIT = False
# launched with PDL (its prologue overlaps the previous kernel's tail; the wait comes before any input is read)
STREAM_PDL = True
# Row tiles per run of a program's GLU units (`moe_glu_decode_parts._unit`): 1 strides unit by unit, so from two tokens
# on a program builds a new token's activation tiles for nearly every unit; runs of LONG_UNIT_RUN tiles of one pair
# from LONG_UNIT_RUN_FROM_PAIRS pairs build them once per run but share the units out less evenly. Session 79 (s79a,
# H100, Flash MoE call in graphs of 16 routings, µs, runs of 1 / 4 / 8): M = 2 69.5 / 77.0 / 73.2, M = 4 126.2 /
# 125.4 / 139.9, M = 8 237.3 / 235.7 / 233.6, M = 11 308.6 / 307.3 / 303.6 (bit-identical). Session 80 (s80a, H100,
# runs of 1 / 8, two rounds alternated): M = 6 (36 pairs) 181.8 / 181.7, 181.9 / 181.6; M = 8 236.7 / 233.1, 237.0 /
# 233.0; M = 11 308.1 / 302.5, 307.8 / 303.5; 8 layers' B = 8 replay 3.06 / 3.05, 3.06 / 3.03 ms. So runs of 8 from
# M = 8 (0 turns them off).
UNIT_RUN = 1
LONG_UNIT_RUN = 8
LONG_UNIT_RUN_FROM_PAIRS = 48
# (Removed in session 79: blocks of two pairs of one expert per work item, session 78's PAIR_BLOCKS -- one weight
# stream for both pairs' MMA chains, bit-identical, but slower than the paired Triton GEMV at M = 16-64 with runs of
# 1 (s78i: 507 vs 440 µs at M = 16, 1,634 vs 1,190 at 64) and of 4 / 8 (s79a: 475-484 vs 440, 1,548 vs 1,190).)
ROWS = 64  # rows per unit (one warpgroup's wgmma M)

if HAS_TRITON and not INTERPRET:
    import triton
    import triton.language as tl
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from dsv4.kernels._triton import gluon_pdl_wait, pdl_kernel, pdl_wait
    from dsv4.kernels.moe_glu_decode_parts import (_build_b, _finish_blocks, _matrices, _scaled, _step_scales, _unit,
                                                   _unit_count, _widen)
    from dsv4.kernels.moe_mma_operands import _glu_out

    U_STEP = gl.constexpr(U)

    @gluon.jit
    def _producer(w_desc, s_desc, w_s, sc_s, ready, free, IDS, num_experts, n_units, n_per, rows_e, I,
                  T: gl.constexpr, S: gl.constexpr, STEPS: gl.constexpr, KR: gl.constexpr, R: gl.constexpr,
                  GLU: gl.constexpr, CONTIG: gl.constexpr, RUN: gl.constexpr):
        NM: gl.constexpr = _matrices(GLU)
        c = 0  # steps issued
        for k in range(_unit_count(n_units, n_per, S, CONTIG, RUN)):
            p, tile, sp = _unit(k, n_per, T, S, CONTIG, RUN)
            e = gl.load(IDS + p)
            if (e >= 0) & (e < num_experts):  # (another rank's expert: skipped by both partitions)
                row = (e * rows_e + tile * 64).to(gl.int32)  # (TMA coordinates are 32-bit)
                for step in range(STEPS):
                    slot = c % R
                    mbarrier.wait(free.index(slot), ((c // R) & 1) ^ 1)  # a fresh barrier passes phase 1
                    mbarrier.expect(ready.index(slot), NM * (2 * 64 * 64 + 64 * 16))
                    # the 16-byte aligned run that holds this step's 8 scale bytes (a start 8 bytes into one faulted,
                    # "illegal instruction", session 47)
                    sc_col = sp * (KR // 32) + 16 * (step // 2)
                    col = (sp * (KR // 128) + 2 * step) * 64
                    for m in gl.static_range(NM):  # (up: I rows further)
                        tma.async_copy_global_to_shared(s_desc, [row + m * I, sc_col], ready.index(slot),
                                                        sc_s.index(NM * slot + m))
                        for u in gl.static_range(2):
                            tma.async_copy_global_to_shared(w_desc, [row + m * I, col + 64 * u], ready.index(slot),
                                                            w_s.index(2 * NM * slot + 2 * m + u))
                    c += 1

    @gluon.jit
    def _consumer(XQ, SX, IDS, P, w_s, sc_s, b_s, ready, free, num_experts, n_units, n_per, I, top_k,
                  stride_x, stride_sx, stride_ps, stride_pp, fin, T: gl.constexpr, S: gl.constexpr,
                  STEPS: gl.constexpr, KR: gl.constexpr, R: gl.constexpr, HALF: gl.constexpr, NCONS: gl.constexpr,
                  GLU: gl.constexpr, CONTIG: gl.constexpr, RUN: gl.constexpr, NR: gl.constexpr):
        """Consumer HALF of NCONS: steps HALF, HALF + NCONS, .. of every unit; its partial goes to range
        sp * NCONS + HALF of P. NR > 0 (the down, FINISH_IN_DOWN): fin = (the GLU's NR partials, the routing
        weights, the SwiGLU limit, the partials' two strides), z's blocks finished from them here first."""
        KBR: gl.constexpr = KR // 128
        NM: gl.constexpr = _matrices(GLU)
        acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 16])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
        r = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
        zero = gl.zeros([64, 8], gl.float32, layout=acc_l)
        sn = gl.arange(0, 8, layout=gl.SliceLayout(0, acc_l))
        if not GLU:  # the down: only its consumers wait for the GLU's z (its producer streams W2 meanwhile)
            gluon_pdl_wait()
        c = 0
        t_built = -1
        for k in range(_unit_count(n_units, n_per, S, CONTIG, RUN)):
            p, tile, sp = _unit(k, n_per, T, S, CONTIG, RUN)
            e = gl.load(IDS + p)
            if (e >= 0) & (e < num_experts):
                t = p // top_k  # (the down GEMV: top_k 1, each pair's own z)
                kb0 = sp * KBR
                if t != t_built:  # (the tiles are the token's; every unit of a program has the same K range)
                    gl.thread_barrier()  # (the MMAs that read the old tiles were waited for)
                    if NR > 0:  # z's blocks of this consumer: stored, then read back below by the same 4 warps
                        _finish_blocks(XQ, SX, fin[0], fin[1], t, stride_x, stride_sx, fin[3], fin[4], I, fin[2], kb0,
                                       KBR, HALF, NCONS, NR)
                        gl.thread_barrier()
                    _build_b(b_s, XQ, t, stride_x, kb0, KBR, HALF, NCONS)
                    fence_async_shared()
                    gl.thread_barrier()
                    t_built = t
                acc_g = zero
                acc_u = zero
                for step in range(HALF, STEPS, NCONS):
                    slot = (c + step) % R
                    # the activation scale per column, x 2^8 (from L1: no shared-memory hazard, no CTA barrier here)
                    sa = gl.load(SX + t.to(gl.int64) * stride_sx + kb0 + 2 * step + sn // 4) * 256.0
                    mbarrier.wait(ready.index(slot), ((c + step) // R) & 1)
                    sc_g = _step_scales(sc_s, NM * slot, step, acc_l)
                    pg = zero
                    pu = zero
                    for u in gl.static_range(U_STEP):
                        g_lo, g_hi = _widen(w_s, 2 * NM * slot + u, a_l)
                        if GLU:
                            u_lo, u_hi = _widen(w_s, 2 * NM * slot + 2 + u, a_l)
                        if u == U_STEP - 1:
                            if GLU:
                                sc_u = _step_scales(sc_s, NM * slot + 1, step, acc_l)
                        b_lo = b_s.index(4 * step + 2 * u).permute((1, 0))
                        b_hi = b_s.index(4 * step + 2 * u + 1).permute((1, 0))
                        pg = warpgroup_mma(g_lo, b_lo, pg, use_acc=u > 0, is_async=True)
                        pg = warpgroup_mma(g_hi, b_hi, pg, is_async=True)
                        if GLU:
                            pu = warpgroup_mma(u_lo, b_lo, pu, use_acc=u > 0, is_async=True)
                            pu = warpgroup_mma(u_hi, b_hi, pu, is_async=True)
                    if GLU:
                        pg, pu = warpgroup_mma_wait(num_outstanding=0, deps=[pg, pu])
                        acc_u = _scaled(acc_u, pu, sc_u, sa)
                    else:
                        pg = warpgroup_mma_wait(num_outstanding=0, deps=[pg])
                    # the slot is free: the MMAs are done, and a warpgroup's MMA runs only once all its warps
                    # issued it, i.e. once every warp holds the bytes it read from the slot
                    mbarrier.arrive(free.index(slot), count=1)
                    acc_g = _scaled(acc_g, pg, sc_g, sa)
                c += STEPS
                dst = P + (sp * NCONS + HALF).to(gl.int64) * stride_ps + p.to(gl.int64) * stride_pp + tile * 64 + r
                gl.store(dst, gl.sum(acc_g, axis=1))
                if GLU:
                    gl.store(dst + I, gl.sum(acc_u, axis=1))

    @pdl_kernel
    @gluon.jit
    def _stream_kernel(w_desc, s_desc, XQ, SX, IDS, P, num_experts, n_units, n_per, rows_e, I, top_k, stride_x,
                       stride_sx, stride_ps, stride_pp, FIN, TOPK_W, limit, stride_fs, stride_fp, T: gl.constexpr,
                       S: gl.constexpr, KR: gl.constexpr, R: gl.constexpr, NCONS: gl.constexpr, REGS: gl.constexpr,
                       GLU: gl.constexpr, CONTIG: gl.constexpr, RUN: gl.constexpr, NR: gl.constexpr = 0):
        """GLU: P[r, p, :I] / P[r, p, I:] = the fp32 gate / up partials of range r of pair p (module docstring);
        else (the down GEMV) P[r, p, :] the fp32 partials of y (rows_e: the weight rows per expert, 2I or D).
        RUN: row tiles per run of a program's units (`_unit`). NR > 0 (the down, FINISH_IN_DOWN): XQ / SX are
        written first, from the GLU's NR partials FIN, its routing weights TOPK_W and SwiGLU limit."""
        fin = (FIN, TOPK_W, limit, stride_fs, stride_fp)
        STEPS: gl.constexpr = KR // 128 // 2
        NM: gl.constexpr = _matrices(GLU)
        w_s = gl.allocate_shared_memory(gl.uint8, [2 * NM * R, 64, 64], w_desc.layout)
        sc_s = gl.allocate_shared_memory(gl.uint8, [NM * R, 64, 16], s_desc.layout)
        b_sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        b_s = gl.allocate_shared_memory(gl.float16, [2 * (KR // 128), 8, 64], b_sl)
        ready = gl.allocate_shared_memory(gl.int64, [R, 1], mbarrier.MBarrierLayout())
        free = gl.allocate_shared_memory(gl.int64, [R, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(R):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(free.index(i), count=1)
        if GLU:  # (everything above touched no input: it overlaps the previous kernel's tail)
            gluon_pdl_wait()  # (the router's ids, the producer's first read, come from the kernel just before)
        # (constexprs inline: a tuple assigned to a name first turns them into tensors, moe_fp8_ws)
        if NCONS == 2:
            gl.warp_specialize([
                (_consumer, (XQ, SX, IDS, P, w_s, sc_s, b_s, ready, free, num_experts, n_units, n_per, I, top_k,
                             stride_x, stride_sx, stride_ps, stride_pp, fin, T, S, STEPS, KR, R, 0, 2, GLU, CONTIG,
                             RUN, NR)),
                (_consumer, (XQ, SX, IDS, P, w_s, sc_s, b_s, ready, free, num_experts, n_units, n_per, I, top_k,
                             stride_x, stride_sx, stride_ps, stride_pp, fin, T, S, STEPS, KR, R, 1, 2, GLU, CONTIG,
                             RUN, NR)),
                (_producer, (w_desc, s_desc, w_s, sc_s, ready, free, IDS, num_experts, n_units, n_per, rows_e, I,
                             T, S, STEPS, KR, R, GLU, CONTIG, RUN)),
            ], [4, 1], [REGS, 40])
        else:
            gl.warp_specialize([
                (_consumer, (XQ, SX, IDS, P, w_s, sc_s, b_s, ready, free, num_experts, n_units, n_per, I, top_k,
                             stride_x, stride_sx, stride_ps, stride_pp, fin, T, S, STEPS, KR, R, 0, 1, GLU, CONTIG,
                             RUN, NR)),
                (_producer, (w_desc, s_desc, w_s, sc_s, ready, free, IDS, num_experts, n_units, n_per, rows_e, I,
                             T, S, STEPS, KR, R, GLU, CONTIG, RUN)),
            ], [1], [40])

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

    def _descriptors(experts: PackedExperts, glu: bool) -> tuple:
        """TMA descriptors of the experts' w13 (glu) or w2 bytes ([E * rows, K/2], boxes [64, 64], 64-byte swizzle)
        and scale bytes ([E * rows, K/32], boxes [64, 16], no swizzle), kept on the expert set (remade if its tensors
        were replaced)."""
        w, sc = (experts.w13, experts.w13_scale) if glu else (experts.w2, experts.w2_scale)
        sc = sc.view(torch.uint8)
        key = (w.data_ptr(), sc.data_ptr())
        name = "glu_decode" if glu else "down_decode"
        cached = experts.tma.get(name)
        if cached is None or cached[0] != key:
            rows = w.shape[0] * w.shape[1]
            w_l = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
            s_l = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
            cached = experts.tma[name] = (key, (
                TensorDescriptor.from_tensor(w.view(rows, w.shape[2]), [64, 64], w_l),
                TensorDescriptor.from_tensor(sc.view(rows, sc.shape[2]), [64, 16], s_l)))
        return cached[1]


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def applies(experts: PackedExperts, x: torch.Tensor, blocks, down: bool = False) -> bool:
    """Whether `glu_decode` (or, down: `down_decode`) takes this GEMV: ENABLED (DOWN_ENABLED), MXFP4 experts on a
    Hopper GPU (TMA, wgmma), one pair per unit (blocks None: not the blocks of pairs of the paired GEMV), and K
    ranges of whole steps for every consumer
    (the GLU's K, hidden: Flash's 4096 yes, Pro's 7168 only with ODD_SPLIT; the down's, inter: Flash's 2048 yes,
    Pro's 3072 only with DOWN_ODD_SPLIT)."""
    from dsv4.kernels.moe_wide import _is_hopper

    return ((DOWN_ENABLED if down else ENABLED) and blocks is None and experts.fmt == "mxfp4" and x.is_cuda
            and not INTERPRET and _is_hopper(x.device) and _split(experts, not down) is not None)


def _split(experts: PackedExperts, glu: bool) -> int | None:
    """The K ranges of this GEMV: SPLIT (the down: DOWN_SPLIT) where it fits, else (ODD_SPLIT) the GLU's most up to
    ODD_SPLIT_MAX that fit (Pro's hidden 7168: 7, on 126 of 132 SMs), (DOWN_ODD_SPLIT) the down's fewest from
    DOWN_SPLIT up to ODD_SPLIT_MAX (Pro's inter 3072: 3), else None (not taken here)."""
    preferred = SPLIT if glu else DOWN_SPLIT
    if _fits(experts, glu, preferred):
        return preferred
    if glu and ODD_SPLIT:
        return next((s for s in range(ODD_SPLIT_MAX, 0, -1) if _fits(experts, glu, s)), None)
    if not glu and DOWN_ODD_SPLIT:
        return next((s for s in range(DOWN_SPLIT, ODD_SPLIT_MAX + 1) if _fits(experts, glu, s)), None)
    return None


def _fits(experts: PackedExperts, glu: bool, split: int) -> bool:
    """The reduced dimension (GLU: hidden, down: inter) splits into split x CONSUMERS ranges of whole U-block steps,
    a power of two of 128-blocks per range (the activation tiles' shared-memory shape: Pro's down, 3072 in one range
    = 24 blocks, failed to compile, session 49), the output rows into 128-blocks."""
    k, n = (experts.hidden, experts.inter) if glu else (experts.inter, experts.hidden)
    blocks = k // BLOCK // split
    return k % (BLOCK * U * split * CONSUMERS) == 0 and blocks & (blocks - 1) == 0 and n % BLOCK == 0


def _launch(xq, sx, ids, experts: PackedExperts, glu: bool, top_k: int, split: int, stages: int,
            fin: tuple | None = None) -> torch.Tensor:
    """The persistent kernel over the routed pairs (GLU: w13 from x's codes; else W2 from z's): its fp32 partials
    [split x CONSUMERS, pairs, 2I or D]. fin (the down only) = (the GLU's partials, routing weights, SwiGLU limit):
    xq / sx are z's buffers, written by the down's consumers first (FINISH_IN_DOWN)."""
    e, i, d = experts.num_experts, experts.inter, experts.hidden
    k, n = (d, i) if glu else (i, d)  # reduced dimension, output rows (per matrix)
    if stages < 1 or stages % CONSUMERS:
        # the consumers take alternate steps: a slot whose uses alternated between them could be waited on at a
        # phase parity the other had not consumed yet (s78f: 3 slots, the down's 5, "unspecified launch failure")
        raise ValueError(f"moe_glu_decode: {stages} ring slots for {CONSUMERS} consumer warpgroups; the ring needs a "
                         "positive multiple of the consumers (each slot always feeds the same one)")
    if split is None or not _fits(experts, glu, split):
        raise ValueError(f"moe_glu_decode: K {k} must split into {split} x {CONSUMERS} ranges of whole {U}-block "
                         f"steps, the {n} output rows into 128-blocks")
    bound = _register_bound(glu)  # (checked before anything is allocated)
    pairs = ids.numel()
    run = _unit_run(pairs, n // ROWS) if glu else 1  # (the down's units are CONTIG runs)
    w_desc, s_desc = _descriptors(experts, glu)
    ranges = split * CONSUMERS  # (each consumer stores its own partial of a unit)
    part = torch.empty((ranges, pairs, 2 * i if glu else d), dtype=torch.float32, device=xq.device)
    t = n // ROWS
    n_units = pairs * t * split
    sms = _sm_count(xq.device.index if xq.device.index is not None else torch.cuda.current_device())
    programs = max(split, min(n_units, sms) // split * split)  # a multiple of S: a program keeps one K range
    n_per = -(-(pairs * t) // (programs // split))  # (CONTIG: a program's run of units of its K range)
    fin_part, tw, limit = fin if fin is not None else (part, part, 0.0)  # (unread without fin)
    kernel = _stream_kernel if STREAM_PDL else _stream_kernel.fn  # (.fn: launched without PDL)
    kernel[(programs,)](
        w_desc, s_desc, xq, sx, ids, part, e, n_units, n_per, 2 * i if glu else d,
        i, top_k, xq.stride(0), sx.stride(0), part.stride(0), part.stride(1), fin_part, tw, float(limit),
        fin_part.stride(0), fin_part.stride(1), T=t, S=split, KR=k // split, R=stages, NCONS=CONSUMERS, GLU=glu,
        CONTIG=not glu, RUN=run, NR=0 if fin is None else fin_part.shape[0], num_warps=4, **bound)
    return part


def _register_bound(glu: bool) -> dict:
    """The launch's `maxnreg` and second consumer's registers: ONE_CONSUMER_MAXNREG with one consumer, else
    GLU_BOUND / DOWN_BOUND where set (else CONSUMER_REGS under Triton's bound)."""
    if CONSUMERS == 1:
        return {"maxnreg": ONE_CONSUMER_MAXNREG, "REGS": CONSUMER_REGS}
    bound = GLU_BOUND if glu else DOWN_BOUND
    # (Triton gives the first consumer 3 x maxnreg - regs - 40 (up to 256); below the second's, a bad pair)
    if bound is not None and (bound[0] % 8 or 3 * bound[0] - bound[1] - 40 < bound[1]):
        raise ValueError(f"moe_glu_decode: register bound {bound} (maxnreg, second consumer's registers) leaves the "
                         "first consumer fewer registers than the second, or maxnreg is not a multiple of 8")
    return {"REGS": CONSUMER_REGS} if bound is None else {"maxnreg": bound[0], "REGS": bound[1]}


def _unit_run(pairs: int, tiles: int) -> int:
    """The GLU's row tiles per run (UNIT_RUN, LONG_UNIT_RUN from LONG_UNIT_RUN_FROM_PAIRS pairs where that is set and
    divides a matrix's tiles; a UNIT_RUN that does not is refused)."""
    # (else the short runs; a LONG_UNIT_RUN below 1 turns long runs off like a LONG_UNIT_RUN_FROM_PAIRS of 0)
    long_ok = 0 < LONG_UNIT_RUN_FROM_PAIRS <= pairs and LONG_UNIT_RUN > 0 and tiles % LONG_UNIT_RUN == 0
    run = LONG_UNIT_RUN if long_ok else UNIT_RUN
    if run < 1 or tiles % run:
        raise ValueError(f"moe_glu_decode: runs of {run} row tiles do not divide the {tiles} of a matrix")
    return run


def glu_decode(xq: torch.Tensor, sx: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, experts: PackedExperts,
               swiglu_limit: float, top_k: int, zq: torch.Tensor, zs: torch.Tensor, split: int | None = None,
               stages: int | None = None, finish: bool = True) -> torch.Tensor | None:
    """GEMM1 of method "mma" (`moe_gemv.mma_glu_stage`'s contract from the quantised x): writes the routed pairs'
    rows of zq [pairs, I] / zs [pairs, I/128] from xq / sx (`quant16_block`'s layout, [M, D] f16 / [M, D/128]).
    finish False: returns the fp32 partials unfinished, for `down_decode(fin=)` (FINISH_IN_DOWN)."""
    part = _launch(xq, sx, ids, experts, True, top_k, _split(experts, True) if split is None else split,
                   STAGES if stages is None else stages)  # (the module's values when called: A/B flags)
    if not finish:
        return part
    pairs, i, ranges = ids.numel(), experts.inter, part.shape[0]
    _finish_kernel[(pairs, i // BLOCK)](part, ids, tw, zq, zs, i, experts.num_experts, float(swiglu_limit),
                                        part.stride(0), part.stride(1), zq.stride(0), zs.stride(0), S=ranges,
                                        num_warps=4)
    return None


def down_decode(zq: torch.Tensor, zs: torch.Tensor, ids: torch.Tensor, experts: PackedExperts,
                split: int | None = None, stages: int | None = None, fin: tuple | None = None) -> torch.Tensor:
    """GEMM2 of method "mma" from z's codes (`mma_glu_stage`'s zq / zs): the fp32 partials [split x CONSUMERS,
    pairs, D] of the routed pairs' y rows (summed per pair and rounded to bf16 by `moe_combine.combine` (3-D y), the
    Triton down's y exactly up to fp32 summation order). fin = (`glu_decode(finish=False)`'s partials, the routing
    weights, the SwiGLU limit): z is finished in this launch first (FINISH_IN_DOWN), into zq / zs."""
    split = _split(experts, False) if split is None else split
    if fin is not None and (split is None or experts.inter // BLOCK // split // CONSUMERS < 4):
        raise ValueError(f"moe_glu_decode: the down finishes z only with >= 4 K blocks per consumer, got inter "
                         f"{experts.inter} in {split} x {CONSUMERS} ranges")
    return _launch(zq, zs, ids, experts, False, 1, split, DOWN_STAGES if stages is None else stages, fin)
