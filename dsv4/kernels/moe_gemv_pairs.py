"""Several (token, slot) pairs of one expert per program of the decode MoE (method "mma" of
dsv4.kernels.moe_gemv, `moe_gemv(..., pairs_per_program=G)`, G = 2 or 4).

Where (moe_config.pick_moe_config, session 18 sweeps): two pairs at U = 2 from ~1.1 pairs per touched expert,
four at U = 1 (16 columns) from 2.3 up to 4.0 (Flash B = 8 .. 64 and 96 .. 128).

Why: from batch ~8 on, touched experts get two or more pairs (B = 64 on Flash: 384 pairs on ~200 experts),
and one-pair programs stream each such expert's weights once per pair. With U 128-wide K blocks per loop step
a pair's block-diagonal activations take 4U MMA columns (column 4u + g: group g of block u), and a one-pair
program's MMA has 16 columns, 16 - 4U of them zero. Pair j of a block takes columns 4Uj .. 4Uj + 4U - 1
(NC = max(16, 4UG) columns, at most 32), so a program serves G pairs of its expert for one weight stream; the
epilogue runs per pair.

Bits: each accumulator column still holds one group's exact fp32 partial, and a pair's output sums the
columns with every other pair's masked to 0.0 -- the one-pair program's sum, whose unused columns are 0.0
(x + 0.0 is x): the same bits for any G at the same U (GPU tests).

Blocks (`pair_blocks`, one program): the pairs sorted by (expert, pair index), each expert's run cut into
blocks of G (the last one padded with -1), blocks in expert order. BLK [P, G] int32 lists the blocks, then
rows of -1 up to P rows, so the launch grid (P blocks) needs no host sync and the unused blocks return at
once. Pairs of other ranks' experts are in no block.
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, pdl_kernel, pdl_wait

MAX_PAIRS = 4096  # one program holds every pair's id
PAIRS_PER_PROGRAM = (1, 2, 4)

if HAS_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _max_combine(a, b):
        return tl.maximum(a, b)

    @pdl_kernel
    @triton.jit
    def _pair_blocks_kernel(IDS, BLK, KEYS, P, num_experts, G: tl.constexpr, BLOCK_P: tl.constexpr):
        """Sort the pairs by (expert, pair index) (other ranks' pairs last), rank each within its expert's
        run, start a block at every rank % G == 0 with the run's next G - 1 pairs."""
        pdl_wait()
        offs = tl.arange(0, BLOCK_P)
        inside = offs < P
        e = tl.load(IDS + offs, mask=inside, other=-1)
        mine = inside & (e >= 0) & (e < num_experts)
        keys = tl.sort(tl.where(mine, e, num_experts) * BLOCK_P + offs)
        se = keys // BLOCK_P
        tl.store(KEYS + offs, keys)
        tl.debug_barrier()  # the sorted keys of every position, for the neighbour loads below (one CTA)
        prev = tl.where(offs > 0, tl.load(KEYS + offs - 1, mask=offs > 0, other=0) // BLOCK_P, -1)
        first = tl.associative_scan(tl.where(se != prev, offs, 0), 0, _max_combine)  # the run's first position
        rank = offs - first
        start = (se < num_experts) & (rank % G == 0)
        j = tl.arange(0, G)
        nxt = offs[:, None] + j[None, :]
        nk = tl.load(KEYS + nxt, mask=nxt < BLOCK_P, other=-1)
        members = tl.where((nk >= 0) & (nk // BLOCK_P == se[:, None]), nk % BLOCK_P, -1)
        blk = tl.cumsum(start.to(tl.int32), axis=0) - 1
        nblk = tl.sum(start.to(tl.int32), axis=0)
        tl.store(BLK + G * blk[:, None] + j[None, :], members, mask=start[:, None])
        unused = inside & (offs >= nblk)
        tl.store(BLK + G * offs[:, None] + j[None, :], tl.full((BLOCK_P, G), -1, tl.int32), mask=unused[:, None])

    @triton.jit
    def _block_first(BLK, IDS, num_experts, G: tl.constexpr):
        """(first pair, expert) of this program's block (program_id(0)); first = -1 if the block is unused."""
        b = tl.program_id(0).to(tl.int64)
        p = tl.load(BLK + G * b).to(tl.int64)
        e = tl.load(IDS + tl.maximum(p, 0)).to(tl.int64)
        return tl.where((e >= 0) & (e < num_experts), p, -1), e

    @triton.jit
    def _column_pairs(BLK, G: tl.constexpr, NC: tl.constexpr, U: tl.constexpr):
        """Per MMA column (4U per pair): the column's pair of this program's block (0 where there is none, for
        address arithmetic) and whether that pair exists."""
        j = tl.arange(0, NC) // (4 * U)
        pc = tl.load(BLK + G * tl.program_id(0).to(tl.int64) + j, mask=j < G, other=-1).to(tl.int64)
        return tl.maximum(pc, 0), pc >= 0

    @triton.jit
    def _act_tiles_g(rows, live, kb, u0: tl.constexpr, KD: tl.constexpr, NC: tl.constexpr, U: tl.constexpr):
        """`moe_mma_operands._act_tiles` for a block: pair j's block-diagonal elements in columns 4Uj ..
        4Uj + 4U - 1 (rows: per column its pair's row, live: `_column_pairs`), one masked load per tile."""
        k = tl.arange(0, 64 * KD)
        n = tl.arange(0, NC)
        col = 4 * (u0 + k // 64) + 2 * ((k // 8) % 2)
        ptr = rows[None, :] + (kb * 128 + (k // 64) * 128 + (k % 64))[:, None]
        c = n % (4 * U)
        lo = tl.load(ptr, mask=live[None, :] & (c[None, :] == col[:, None]), other=0.0)
        hi = tl.load(ptr + 64, mask=live[None, :] & (c[None, :] == col[:, None] + 1), other=0.0)
        return lo, hi

    @triton.jit
    def _act_scales_g(srows, live, kb0, NC: tl.constexpr, U: tl.constexpr):
        """`moe_mma_operands._act_scales` (times 2^8) for a block: column 4Uj + 4u + g takes pair j's block
        kb0 + u."""
        n = tl.arange(0, NC)
        return tl.load(srows + kb0 + (n % (4 * U)) // 4, mask=live, other=0.0) * 256.0

    @triton.jit
    def _pair_sum(acc, j: tl.constexpr, NC: tl.constexpr, U: tl.constexpr):
        """Row sums of pair j's columns of an [N, NC] accumulator (the others masked to 0.0)."""
        return tl.sum(tl.where((tl.arange(0, NC) // (4 * U) == j)[None, :], acc, 0.0), axis=1)

    @triton.jit
    def _block_member(BLK, j: tl.constexpr, G: tl.constexpr):
        """Pair j of this program's block (-1: none)."""
        return tl.load(BLK + G * tl.program_id(0).to(tl.int64) + j).to(tl.int64)


def pair_blocks(ids: torch.Tensor, num_experts: int, per_program: int) -> torch.Tensor:
    """BLK [P, G] int32 (module docstring) for the flat pair ids [P] (other ranks' experts outside [0, E))."""
    pairs = ids.numel()
    if pairs > MAX_PAIRS:
        raise ValueError(f"pair_blocks: at most {MAX_PAIRS} pairs, got {pairs}")
    if per_program not in PAIRS_PER_PROGRAM[1:]:
        raise ValueError(f"pair_blocks: per_program must be one of {PAIRS_PER_PROGRAM[1:]}, got {per_program!r}")
    blk = torch.empty((pairs, per_program), dtype=torch.int32, device=ids.device)
    block = max(16, triton.next_power_of_2(pairs))
    keys = torch.empty((block,), dtype=torch.int32, device=ids.device)
    _pair_blocks_kernel[(1,)](ids, blk, keys, pairs, num_experts, G=per_program, BLOCK_P=block,
                              num_warps=4 if block <= 1024 else 8)
    return blk


def pair_blocks_ref(ids: torch.Tensor, num_experts: int, per_program: int) -> torch.Tensor:
    """The blocks written out in Python (the kernel's reference)."""
    ids = ids.tolist()
    out = []
    for e in range(num_experts):
        mine = [p for p, x in enumerate(ids) if x == e]
        for r in range(0, len(mine), per_program):
            chunk = mine[r:r + per_program]
            out.append(chunk + [-1] * (per_program - len(chunk)))
    out += [[-1] * per_program] * (len(ids) - len(out))
    return torch.tensor(out, dtype=torch.int32).view(-1, per_program)
