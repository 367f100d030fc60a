"""Two (token, slot) pairs of one expert per program of the decode MoE (method "mma" of dsv4.kernels.moe_gemv,
`moe_gemv(..., pairs_per_program=2)`).

Why: from batch ~16 on, touched experts get two or more pairs (B = 64 on Flash: 384 pairs on ~200 experts),
and the one-pair programs stream each such expert's weights once per pair. With one K loop step of two
128-wide blocks (U = 2) a one-pair program's MMA uses only 8 of its 16 activation columns (column 4u + g:
group g of block u). The second pair's block-diagonal activations fill columns 8..15, so a program serves two
pairs of its expert for the same weight stream and the same MMAs; the epilogue runs per pair.

Bits: each accumulator column still holds one group's exact fp32 partial, and a pair's output sums its own
16 columns with the other pair's 8 masked to 0.0 -- the one-pair program's sum, whose 8 unused columns are
0.0 (x + 0.0 is x): the same bits either way (GPU test).

Pairing (`pair_blocks`, one program): pair p of expert e with rank r among e's pairs (in pair order) starts
a block if r is even, with the next pair of e (or none) as its partner; blocks are numbered in pair order.
BLK [P, 2] int32 lists (first, partner or -1), then (-1, -1) up to P rows, so the launch grid (P blocks)
needs no host sync and the unused blocks return at once. Pairs of other ranks' experts are in no block.
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, pdl_kernel, pdl_wait

MAX_PAIRS = 4096  # one program holds every pair's id

if HAS_TRITON:
    import triton
    import triton.language as tl

    @pdl_kernel
    @triton.jit
    def _pair_blocks_kernel(IDS, BLK, P, num_experts, BLOCK_P: tl.constexpr, QC: tl.constexpr):
        pdl_wait()
        offs = tl.arange(0, BLOCK_P)
        inside = offs < P
        e = tl.load(IDS + offs, mask=inside, other=-1)
        mine = inside & (e >= 0) & (e < num_experts)
        rank = tl.zeros((BLOCK_P,), dtype=tl.int32)
        partner = tl.full((BLOCK_P,), BLOCK_P, dtype=tl.int32)
        for q0 in range(0, P, QC):
            q = q0 + tl.arange(0, QC)
            eq = tl.load(IDS + q, mask=q < P, other=-2)
            same = (e[:, None] == eq[None, :]) & mine[:, None] & (q < P)[None, :]
            rank += tl.sum((same & (q[None, :] < offs[:, None])).to(tl.int32), axis=1)
            later = tl.where(same & (q[None, :] > offs[:, None]), q[None, :], BLOCK_P)
            partner = tl.minimum(partner, tl.min(later, axis=1))
        start = mine & (rank % 2 == 0)
        blk = tl.cumsum(start.to(tl.int32), axis=0) - 1
        nblk = tl.sum(start.to(tl.int32), axis=0)
        tl.store(BLK + 2 * blk, offs, mask=start)
        tl.store(BLK + 2 * blk + 1, tl.where(partner < BLOCK_P, partner, -1), mask=start)
        unused = inside & (offs >= nblk)
        tl.store(BLK + 2 * offs, tl.full((BLOCK_P,), -1, tl.int32), mask=unused)
        tl.store(BLK + 2 * offs + 1, tl.full((BLOCK_P,), -1, tl.int32), mask=unused)

    @triton.jit
    def _block_pairs(BLK, IDS, num_experts):
        """(first pair, partner or -1, expert) of this program's block (program_id(0)); first = -1 if the block
        is unused."""
        b = tl.program_id(0).to(tl.int64)
        p = tl.load(BLK + 2 * b).to(tl.int64)
        p1 = tl.load(BLK + 2 * b + 1).to(tl.int64)
        e = tl.load(IDS + tl.maximum(p, 0)).to(tl.int64)
        p = tl.where((e >= 0) & (e < num_experts), p, -1)
        return p, p1, e

    @triton.jit
    def _act_tiles2(Arow, Arow1, has1, kb, u0: tl.constexpr, KD: tl.constexpr):
        """`moe_mma_operands._act_tiles` for two pairs (U = 2): the first pair's block-diagonal elements in columns
        0..7, the second's (row Arow1, if has1) in 8..15, one masked load per tile."""
        k = tl.arange(0, 64 * KD)
        n = tl.arange(0, 16)
        col = 4 * (u0 + k // 64) + 2 * ((k // 8) % 2)
        base = tl.where(n < 8, Arow, Arow1)
        ptr = base[None, :] + (kb * 128 + (k // 64) * 128 + (k % 64))[:, None]
        live = ((n < 8) | has1)[None, :]
        lo = tl.load(ptr, mask=live & ((n % 8)[None, :] == col[:, None]), other=0.0)
        hi = tl.load(ptr + 64, mask=live & ((n % 8)[None, :] == col[:, None] + 1), other=0.0)
        return lo, hi

    @triton.jit
    def _act_scales2(SArow, SArow1, has1, kb0):
        """`moe_mma_operands._act_scales` (times 2^8) for two pairs: column 8j + 4u + g takes pair j's block kb0 + u."""
        n = tl.arange(0, 16)
        base = tl.where(n < 8, SArow, SArow1)
        return tl.load(base + kb0 + (n % 8) // 4, mask=(n < 8) | has1, other=0.0) * 256.0

    @triton.jit
    def _pair_sums(acc):
        """Row sums of the first pair's columns (0..7) and the second's (8..15) of an [N, 16] accumulator."""
        first = (tl.arange(0, 16) < 8)[None, :]
        return tl.sum(tl.where(first, acc, 0.0), axis=1), tl.sum(tl.where(first, 0.0, acc), axis=1)


def pair_blocks(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """BLK [P, 2] int32 (module docstring) for the flat pair ids [P] (other ranks' experts outside [0, E))."""
    pairs = ids.numel()
    if pairs > MAX_PAIRS:
        raise ValueError(f"pair_blocks: at most {MAX_PAIRS} pairs, got {pairs}")
    blk = torch.empty((pairs, 2), dtype=torch.int32, device=ids.device)
    block = max(16, triton.next_power_of_2(pairs))
    _pair_blocks_kernel[(1,)](ids, blk, pairs, num_experts, BLOCK_P=block, QC=16 if block <= 512 else 4,
                              num_warps=4 if block <= 512 else 8)
    return blk


def pair_blocks_ref(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The pairing in plain Python (the kernel's reference)."""
    out, seen, open_block = [], {}, {}
    for p, e in enumerate(ids.tolist()):
        if not 0 <= e < num_experts:
            continue
        r = seen.get(e, 0)
        seen[e] = r + 1
        if r % 2 == 0:
            open_block[e] = len(out)
            out.append([p, -1])
        else:
            out[open_block[e]][1] = p
    out += [[-1, -1]] * (ids.numel() - len(out))
    return torch.tensor(out, dtype=torch.int32).view(-1, 2)
