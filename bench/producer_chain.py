"""A persistent chain of one-row FP8 linears with a producer warp (Gluon): the design sessions 23-24 left as the way
to a B = 1 decode step near its bytes (docs/kernels_e2e_notes.md "Session 23", "Session 24"). Bench-only prototype.

The chain is bench_grid_barrier.py's: y_{s+1} = W_s . q(y_s), D x D FP8 weights with 128 x 128 scales, the
activation quantised per 128 (power-of-two scale, e4m3), fp32 sums, bf16 between stages; split-K partials go through
global memory and the next stage sums them. One program per SM (cooperative launch), two partitions:

  producer (1 warp)     streams this program's weight tiles of every stage, in the order they are used, into a ring
                        of R shared-memory slots by TMA (one mbarrier "full" per slot). It never waits on the
                        activations, only on a free slot ("empty"), so while the consumers wait at a stage's grid
                        barrier it is already loading the next stage's tiles, up to R tiles ahead.
  consumers (4 warps)   per stage: grid barrier (a named CTA barrier of their 128 threads around one thread's
                        release add / acquire polling, `grid_barrier.arrive_and_wait_asm`), the previous stage's
                        partials from L2, quantise per 128, then per tile: wait "full", multiply-accumulate on CUDA
                        cores from shared memory, free the slot, store the fp32 partial.

So a stage boundary costs the barrier and the hand-off of the partials, but no weight load latency: the question
bench_producer_chain.py answers is how close the chain gets to bytes at copy bandwidth + ≈ 1-2 µs per stage.

Numerics: the activation scale and the weight block scale are folded into the quantised activations (exact for
power-of-two scales, which the bench draws) and each tile's products are summed per row once per item, so the
fp32 sums run in another order than `fp8_gemv`'s: compare with a tolerance, and at 1 and 2 stages (a hand-off race
shows from the second stage on as an error of 0.1 and more, as the removed "dot" chain's did).
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, INTERPRET
from dsv4.kernels.grid_barrier import arrive_and_wait_asm

BK = 128  # K block (the weight scale's block)
CONSUMER_WARPS = 4

if HAS_TRITON and not INTERPRET:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from dsv4.kernels.fp8_linear import _e4m3, _pow2_scale

    _BK = gl.constexpr(BK)
    # named barrier 15 for the consumer partition's 128 threads (the producer warp never takes part)
    _CONSUMER_BARRIER = gl.constexpr(arrive_and_wait_asm(f"bar.sync 15, {32 * CONSUMER_WARPS}"))

    @gluon.jit
    def _consumer_grid_barrier(CNT):
        """The consumers' grid barrier; returns 0, which the reads after it add to their addresses: a data
        dependency, so that no scheduling pass can hoist them above it (Triton's pipeliner did exactly that to
        the removed "dot" chain's asm loads, docs/kernels_e2e_notes.md "Session 24")."""
        nprog = gl.num_programs(0).to(gl.int64)
        return gl.inline_asm_elementwise(_CONSUMER_BARRIER, "=r,l,l", [CNT, nprog], dtype=gl.int32, is_pure=False,
                                         pack=1)

    @gluon.jit
    def _item(pid, j, nprog, SPLIT: gl.constexpr):
        """(row tile, K split) of this program's j-th item of a stage."""
        it = pid + j * nprog
        return it // SPLIT, it % SPLIT

    @gluon.jit
    def _producer(w_desc, w_bufs, full, empty, S, D, PER, SPLIT: gl.constexpr, BN: gl.constexpr,
                  KB_PER: gl.constexpr):
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        R: gl.constexpr = w_bufs.type.shape[0]
        c = 0
        for s in range(S):
            for j in range(PER):
                t, sp = _item(pid, j, nprog, SPLIT)
                for step in range(KB_PER):
                    slot = c % R
                    mbarrier.wait(empty.index(slot), ((c // R) & 1) ^ 1)  # a fresh barrier passes phase 1
                    mbarrier.expect(full.index(slot), BN * _BK)
                    tma.async_copy_global_to_shared(w_desc, [s * D + t * BN, (sp * KB_PER + step) * _BK],
                                                    full.index(slot), w_bufs.index(slot))
                    c += 1

    @gluon.jit
    def _stage_input(X, P, s, D, kb0, after, KB_PER: gl.constexpr, SPLIT: gl.constexpr, layout: gl.constexpr):
        """This item's activations [KB_PER, 128] from K block kb0 on: X (stage 0) or the bf16 rounding of the
        previous stage's partials (read from L2, `after` = the barrier's 0), all in one round trip."""
        offs = (after + kb0 * _BK + gl.expand_dims(gl.arange(0, KB_PER, layout=gl.SliceLayout(1, layout)), 1) * _BK
                + gl.expand_dims(gl.arange(0, _BK, layout=gl.SliceLayout(0, layout)), 0))
        if s == 0:
            x = gl.load(X + offs).to(gl.float32)
        else:
            x = gl.load(P + ((s - 1) % 2) * SPLIT * D + offs, cache_modifier=".cg")
            for q in gl.static_range(1, SPLIT):
                x += gl.load(P + ((s - 1) % 2) * SPLIT * D + q * D + offs, cache_modifier=".cg")
            x = x.to(gl.bfloat16).to(gl.float32)
        return x

    @gluon.jit
    def _consumer(X, SW, P, Y, CNT, w_bufs, x_smem, full, empty, S, D, PER, SPLIT: gl.constexpr, BN: gl.constexpr,
                  KB_PER: gl.constexpr, layout: gl.constexpr):
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        R: gl.constexpr = w_bufs.type.shape[0]
        kb_total = D // _BK
        rows_l: gl.constexpr = gl.SliceLayout(1, layout)
        cols_l: gl.constexpr = gl.SliceLayout(0, layout)
        k = gl.arange(0, _BK, layout=cols_l)
        r = gl.arange(0, BN, layout=rows_l)
        c = 0
        for s in range(S):
            after = 0
            if s > 0:
                after = _consumer_grid_barrier(CNT)
            for j in range(PER):
                t, sp = _item(pid, j, nprog, SPLIT)
                # the item's activations, quantised per 128 with the weight block scale folded in, into shared
                # memory: one L2 round trip per item instead of one per K block
                x = _stage_input(X, P, s, D, sp * KB_PER, after, KB_PER, SPLIT, layout)
                sx, inv = _pow2_scale(gl.maximum(gl.max(gl.abs(x), axis=1), 1e-4))
                sw = gl.load(SW + s * kb_total * kb_total + (t * BN // _BK) * kb_total + sp * KB_PER
                             + gl.arange(0, KB_PER, layout=rows_l))
                xq = _e4m3(gl.minimum(gl.maximum(x * gl.expand_dims(inv, 1), -448.0), 448.0)).to(gl.float32)
                xs = xq * gl.expand_dims(sx * sw, 1)
                gl.thread_barrier()  # the previous item's reads of x_smem are done
                x_smem.store(xs)
                gl.thread_barrier()
                acc = gl.zeros([BN, _BK], gl.float32, layout)
                # the same unswizzled row-major bytes as KB_PER buffers of one row each
                x_rows = x_smem._reinterpret(gl.float32, [KB_PER, _BK], gl.SwizzledSharedLayout(1, 1, 1, [0]))
                for step in range(KB_PER):
                    xrow = x_rows.index(step).load(cols_l)
                    slot = c % R
                    mbarrier.wait(full.index(slot), (c // R) & 1)
                    w = w_bufs.index(slot).load(layout)
                    gl.thread_barrier()  # every consumer warp has its part of the tile in registers
                    fence_async_shared()
                    mbarrier.arrive(empty.index(slot), count=1)
                    acc += w.to(gl.float32) * gl.expand_dims(xrow, 0)
                    c += 1
                gl.store(P + (s % 2) * SPLIT * D + sp * D + t * BN + r, gl.sum(acc, axis=1))
        after = _consumer_grid_barrier(CNT)
        if pid < D // _BK:  # the chain's output: bf16 of the last stage's summed partials
            kk = after + pid * _BK + k
            y = gl.load(P + ((S - 1) % 2) * SPLIT * D + kk, cache_modifier=".cg")
            for q in gl.static_range(1, SPLIT):
                y += gl.load(P + ((S - 1) % 2) * SPLIT * D + q * D + kk, cache_modifier=".cg")
            gl.store(Y + kk, y.to(gl.bfloat16))

    @gluon.jit
    def producer_chain_kernel(X, w_desc, SW, P, Y, CNT, S, D, PER, SPLIT: gl.constexpr, BN: gl.constexpr,
                              KB_PER: gl.constexpr, R: gl.constexpr, num_warps: gl.constexpr):
        """The chain (module docstring). X bf16 [D]; w_desc over the stages' weights as [S * D, D] e4m3, blocks
        [BN, 128]; SW fp32 [S, D/128, D/128]; P fp32 [2, SPLIT, D] partials; Y bf16 [D]; CNT the barrier counter.
        PER items per program and stage: (D / BN) * SPLIT == PER * programs; KB_PER = D / 128 / SPLIT."""
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
        w_bufs = gl.allocate_shared_memory(w_desc.dtype, [R] + w_desc.block_type.shape, w_desc.layout)
        x_smem = gl.allocate_shared_memory(gl.float32, [KB_PER, _BK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        full = gl.allocate_shared_memory(gl.int64, [R, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [R, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(R):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        gl.warp_specialize([
            (_consumer, (X, SW, P, Y, CNT, w_bufs, x_smem, full, empty, S, D, PER, SPLIT, BN, KB_PER, layout)),
            (_producer, (w_desc, w_bufs, full, empty, S, D, PER, SPLIT, BN, KB_PER)),
        ], [1], [24])

    def weight_descriptor(w: torch.Tensor, bn: int) -> TensorDescriptor:
        """TMA descriptor of the stages' weights [S, D, D] e4m3 viewed as [S * D, D], blocks [bn, 128]."""
        s, d, _ = w.shape
        layout = gl.NVMMASharedLayout.get_default_for([bn, BK], gl.float8e4nv)
        return TensorDescriptor.from_tensor(w.view(s * d, d), [bn, BK], layout)


def chain_shape(d: int, programs: int, bn: int = 64) -> tuple[int, int]:
    """(SPLIT, PER): the smallest K split (a power of two leaving a power of two of K blocks per split: the kernel's
    KB_PER) and the items per program so that (d / bn) * SPLIT == PER * programs; ValueError if none divides."""
    tiles, kb = d // bn, d // BK
    for split in (s for s in (1, 2, 4, 8, 16, 32) if kb % s == 0 and (kb // s) & (kb // s - 1) == 0):
        if (tiles * split) % programs == 0:
            return split, tiles * split // programs
    raise ValueError(f"producer chain: {tiles} tiles of {bn} rows do not split evenly over {programs} programs")
