"""Token -> expert sorting for the grouped MoE GEMM.

The M x top_k (token, slot) pairs are numbered `pair = token * top_k + slot`. They are grouped by
expert (experts in ascending order), and each expert's segment is padded to a multiple of
`block_m` so that every GEMM program of `block_m` rows sees a single expert.

Outputs (sizes depend only on M * top_k, the expert count and block_m, so a CUDA graph can hold them):
* `sorted_ids` int32 [max_blocks * block_m]: a pair id, or the sentinel `M * top_k` in padding;
  inside one expert's segment the pairs are in ascending order.
* `expert_ids` int32 [max_blocks]: the expert of each block, -1 past the last used block.
* `num_post_padded` int32 [1]: number of used slots (a multiple of block_m).

An id outside [0, num_experts) (-1 by convention) marks a pair this process does not compute (a
routed expert held by another EP rank): it is left out of every segment.
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, tl, triton  # noqa: F401


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of Σ_e ceil(count_e / block_m): full blocks plus one partial block per used expert."""
    return -(-num_pairs // block_m) + min(num_pairs, num_experts)


def _check(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> None:
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids: expected int32/int64 [M, top_k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")
    if num_experts <= 0 or block_m <= 0:
        raise ValueError(f"moe_align: num_experts={num_experts} and block_m={block_m} must be positive")


def moe_align_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Torch reference: pairs of each expert in ascending pair order (stable sort)."""
    _check(topk_ids, num_experts, block_m)
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    nb = max_blocks(numel, num_experts, block_m)
    valid = (flat >= 0) & (flat < num_experts)
    counts = torch.bincount(flat[valid], minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts  # unpadded start of each expert in sorted order
    order = torch.argsort(torch.where(valid, flat, num_experts), stable=True)[: int(valid.sum())]
    experts_sorted = flat[order]
    rank = torch.arange(order.numel(), device=flat.device) - first[experts_sorted]
    sorted_ids = torch.full((nb * block_m,), numel, dtype=torch.int32, device=flat.device)
    sorted_ids[starts[experts_sorted] + rank] = order.to(torch.int32)
    blocks = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_m)
    expert_ids = torch.full((nb,), -1, dtype=torch.int32, device=flat.device)
    expert_ids[: blocks.numel()] = blocks.to(torch.int32)
    num_post = padded.sum().to(torch.int32).reshape(1)
    return sorted_ids, expert_ids, num_post


if HAS_TRITON:

    @triton.jit
    def _table_rows(ends, total, EXPERT_IDS, b_lo, b_hi, BM: tl.constexpr, BLOCK_B: tl.constexpr):
        """Rows [b_lo, b_hi) of the block -> expert table from the segments' padded ends (-1 past `total`)."""
        for b0 in range(b_lo, b_hi, BLOCK_B):
            b = b0 + tl.arange(0, BLOCK_B)
            pos = b * BM
            # the expert owning slot `pos` is the number of segments that end at or before it
            eid = tl.sum((ends[None, :] <= pos[:, None]).to(tl.int32), axis=1)
            eid = tl.where(pos < total, eid, -1)
            tl.store(EXPERT_IDS + b, eid, mask=b < b_hi)

    @triton.jit
    def _expert_table(counts, EXPERT_IDS, NUM_POST, nb_max, BM: tl.constexpr, BLOCK_B: tl.constexpr):
        """Per-expert pair counts -> each expert's padded segment start (returned), the used-slot count and
        the block -> expert table (-1 past the last used block)."""
        padded = (counts + BM - 1) // BM * BM
        ends = tl.cumsum(padded, 0)
        total = tl.sum(padded, 0)
        tl.store(NUM_POST, total)
        _table_rows(ends, total, EXPERT_IDS, 0, nb_max, BM, BLOCK_B)
        return ends - padded

    @triton.jit
    def _scatter_pairs(TOPK, SORTED, lo, hi, cursor, num_experts, E_POW2: tl.constexpr, SCATTER: tl.constexpr):
        """Pairs [lo, hi) to their slots, in ascending pair order: the rank of a pair inside its expert is the
        expert's cursor plus the number of equal ids before it in the same slice. No atomics."""
        e_offs = tl.arange(0, E_POW2)
        for start in range(lo, hi, SCATTER):
            offs = start + tl.arange(0, SCATTER)
            m = offs < hi
            ids = tl.load(TOPK + offs, mask=m, other=-1).to(tl.int32)
            m = m & (ids >= 0) & (ids < num_experts)  # other ids: pairs computed elsewhere
            ids = tl.where(m, ids, -1)
            onehot = ids[:, None] == e_offs[None, :]
            base = tl.sum(tl.where(onehot, cursor[None, :], 0), axis=1)
            earlier = (ids[:, None] == ids[None, :]) & (offs[None, :] < offs[:, None])
            rank = tl.sum(earlier.to(tl.int32), axis=1)
            tl.store(SORTED + base + rank, offs, mask=m)
            cursor += tl.sum(onehot.to(tl.int32), axis=0)

    @triton.jit
    def _chunk_counts(TOPK, lo, hi, num_experts, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
        """Per-expert counts of the pairs [lo, hi) (in CHUNK steps)."""
        counts = tl.zeros((E_POW2,), dtype=tl.int32)
        for start in range(lo, hi, CHUNK):
            offs = start + tl.arange(0, CHUNK)
            m = offs < hi
            ids = tl.load(TOPK + offs, mask=m, other=0).to(tl.int32)
            m = m & (ids >= 0) & (ids < num_experts)
            counts += tl.histogram(tl.where(m, ids, 0), E_POW2, mask=m)
        return counts

    @triton.jit(do_not_specialize=["numel", "nb_max"])
    def _moe_align_kernel(
        TOPK, SORTED, EXPERT_IDS, NUM_POST,
        numel, num_experts, nb_max,
        BM: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr, SCATTER: tl.constexpr,
        BLOCK_B: tl.constexpr,
    ):
        # One program: counts, padded offsets, the block -> expert table, then the scatter. SORTED arrives
        # filled with the sentinel, so only real pairs are written here.
        counts = _chunk_counts(TOPK, 0, numel, num_experts, E_POW2, CHUNK)
        starts = _expert_table(counts, EXPERT_IDS, NUM_POST, nb_max, BM, BLOCK_B)
        _scatter_pairs(TOPK, SORTED, 0, numel, starts, num_experts, E_POW2, SCATTER)

    # "blocks": the same in three launches over blocks of CHUNK pairs (counts per block; per expert, the pairs in
    # the blocks before each block and the total; every block scatters its own pairs from its expert's start plus
    # that prefix, and writes its share of the block -> expert table), for many pairs.

    @triton.jit(do_not_specialize=["numel"])
    def _block_counts_kernel(TOPK, COUNTS, numel, num_experts, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
        blk = tl.program_id(0)
        lo = blk * CHUNK
        counts = _chunk_counts(TOPK, lo, tl.minimum(lo + CHUNK, numel), num_experts, E_POW2, CHUNK)
        tl.store(COUNTS + blk * E_POW2 + tl.arange(0, E_POW2), counts)

    @triton.jit(do_not_specialize=["nblk"])
    def _block_prefix_kernel(COUNTS, PREFIX, TOTALS, nblk, E_POW2: tl.constexpr, ES: tl.constexpr,
                             BB: tl.constexpr):
        """Experts [pid ES, (pid + 1) ES): COUNTS [nblk, E_POW2] -> PREFIX (each block's pairs of the expert in
        the blocks before it) and TOTALS [E_POW2], BB blocks per step (one program per slice of experts: a single
        program walking every block serially took ≈ 40 µs at 8K tokens, s30d). PREFIX is not COUNTS: a value is
        held by several warps, and one warp's store could land before another's load (s30c)."""
        es = tl.program_id(0) * ES + tl.arange(0, ES)
        carry = tl.zeros((ES,), dtype=tl.int32)
        for b0 in range(0, nblk, BB):
            b = b0 + tl.arange(0, BB)
            m = (b < nblk)[:, None]
            c = tl.load(COUNTS + b[:, None] * E_POW2 + es[None, :], mask=m, other=0)
            tl.store(PREFIX + b[:, None] * E_POW2 + es[None, :], carry[None, :] + tl.cumsum(c, 0) - c, mask=m)
            carry += tl.sum(c, 0)
        tl.store(TOTALS + es, carry)

    @triton.jit(do_not_specialize=["numel", "nb_max"])
    def _block_scatter_kernel(TOPK, SORTED, PREFIX, TOTALS, EXPERT_IDS, NUM_POST, numel, num_experts, nb_max,
                              BM: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr, SCATTER: tl.constexpr,
                              BLOCK_B: tl.constexpr):
        """Block `pid`'s pairs to their slots (cursor = the expert's padded start + PREFIX), and rows
        [pid TB, (pid + 1) TB) of the block -> expert table (TB = nb_max / programs, rounded up)."""
        blk = tl.program_id(0)
        e_offs = tl.arange(0, E_POW2)
        padded = (tl.load(TOTALS + e_offs) + BM - 1) // BM * BM
        ends = tl.cumsum(padded, 0)
        total = tl.sum(padded, 0)
        if blk == 0:
            tl.store(NUM_POST, total)
        per = tl.cdiv(nb_max, tl.num_programs(0))
        _table_rows(ends, total, EXPERT_IDS, blk * per, tl.minimum(blk * per + per, nb_max), BM, BLOCK_B)
        lo = blk * CHUNK
        cursor = ends - padded + tl.load(PREFIX + blk * E_POW2 + e_offs)
        _scatter_pairs(TOPK, SORTED, lo, tl.minimum(lo + CHUNK, numel), cursor, num_experts, E_POW2, SCATTER)


SORT_ABOVE = 4096  # pairs: beyond this the single-program scan (serial over pairs) loses to a sort
# the method above SORT_ABOVE: "sort" (torch's device sort, ≈ 25 torch ops: ≈ 1 ms of host time per call at 8K
# tokens, s29f) or "blocks" (three Triton launches). H200 s30c, whole MoE call with moe_wide.MIXED_TILES_KERNEL:
# M=2048 2.43 -> 2.31 ms, 8192 6.86 -> 6.72; fresh 2048-token forward of 4 layers: wall 21.1 -> 19.0 ms. Session 30
# then replaced its one-program cursor kernel (≈ 40 µs per call at 8K tokens) by per-expert-slice prefix programs
# (interpreter-tested; GPU test first in run_device_s31a.sh; should it fail there, "sort" is the GPU-tested fallback)
LARGE = "blocks"
BLOCK_PAIRS = 512  # pairs per program of "blocks"


def _moe_align_sort(flat: torch.Tensor, num_experts: int, block_m: int):
    """`moe_align_ref` without host synchronisation (a stable device sort; graph-capturable): long
    prefills, where the single-program scan walks tens of thousands of pairs serially."""
    numel, dev = flat.numel(), flat.device
    nb = max_blocks(numel, num_experts, block_m)
    key = torch.where((flat >= 0) & (flat < num_experts), flat.long(), num_experts)  # foreign -> last
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts + block_m - 1) // block_m * block_m
    padded = torch.cat((padded[:num_experts], padded.new_zeros(1)))  # foreign pairs get no segment
    ends = torch.cumsum(padded, 0)
    first = torch.cumsum(counts, 0) - counts  # unpadded start of each expert in sorted order
    order = torch.argsort(key, stable=True)
    es = key[order]
    dest = ends[es] - padded[es] + torch.arange(numel, device=dev) - first[es]
    dest = torch.where(es < num_experts, dest, nb * block_m)  # foreign pairs -> a dropped spare slot
    sorted_ids = torch.full((nb * block_m + 1,), numel, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    total = ends[num_experts - 1]
    pos = torch.arange(nb, device=dev) * block_m
    expert_ids = torch.searchsorted(ends[:num_experts], pos, right=True)
    expert_ids = torch.where(pos < total, expert_ids, -1).to(torch.int32)
    return sorted_ids[: nb * block_m], expert_ids, total.to(torch.int32).reshape(1)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int, method: str | None = None):
    """Triton version of `moe_align_ref` (same outputs, bit for bit). `method`: "scan" (one Triton
    program), "sort" (device sort) or "blocks" (three launches over blocks of pairs), for many pairs; None: by
    size (LARGE above SORT_ABOVE pairs)."""
    _check(topk_ids, num_experts, block_m)
    flat = topk_ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    numel = flat.numel()
    if method not in (None, "scan", "sort", "blocks"):
        raise ValueError(f"moe_align: method must be 'scan', 'sort', 'blocks' or None, got {method!r}")
    if method is None and numel > SORT_ABOVE:
        method = LARGE
    if method == "sort":
        return _moe_align_sort(flat, num_experts, block_m)
    nb = max_blocks(numel, num_experts, block_m)
    dev = topk_ids.device
    sorted_ids = torch.full((nb * block_m,), numel, dtype=torch.int32, device=dev)
    expert_ids = torch.empty((nb,), dtype=torch.int32, device=dev)
    num_post = torch.empty((1,), dtype=torch.int32, device=dev)
    e_pow2 = triton.next_power_of_2(num_experts)
    scatter = max(16, min(128, 8192 // e_pow2))  # keeps the [SCATTER, E] one-hot tile in registers
    if method == "blocks" and numel:
        nblk = triton.cdiv(numel, BLOCK_PAIRS)
        counts = torch.empty((nblk, e_pow2), dtype=torch.int32, device=dev)
        _block_counts_kernel[(nblk,)](flat, counts, numel, num_experts, E_POW2=e_pow2, CHUNK=BLOCK_PAIRS)
        prefix = torch.empty_like(counts)
        totals = torch.empty((e_pow2,), dtype=torch.int32, device=dev)
        es = min(32, e_pow2)
        _block_prefix_kernel[(e_pow2 // es,)](counts, prefix, totals, nblk, E_POW2=e_pow2, ES=es, BB=64)
        _block_scatter_kernel[(nblk,)](flat, sorted_ids, prefix, totals, expert_ids, num_post, numel, num_experts, nb,
                                       BM=block_m, E_POW2=e_pow2, CHUNK=BLOCK_PAIRS, SCATTER=scatter,
                                       BLOCK_B=max(16, 8192 // e_pow2), num_warps=8)
        return sorted_ids, expert_ids, num_post
    _moe_align_kernel[(1,)](
        flat, sorted_ids, expert_ids, num_post, numel, num_experts, nb,
        BM=block_m, E_POW2=e_pow2, CHUNK=1024, SCATTER=scatter, BLOCK_B=max(16, 8192 // e_pow2), num_warps=8,
    )
    return sorted_ids, expert_ids, num_post
