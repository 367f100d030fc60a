"""Token -> expert sorting for the grouped MoE GEMM.

The M x top_k (token, slot) pairs are numbered `pair = token * top_k + slot`. They are grouped by
expert (experts in ascending order), and each expert's segment is padded to a multiple of
`block_m` so that every GEMM program of `block_m` rows sees a single expert.

Outputs (sizes depend only on M * top_k, the expert count and block_m, so a CUDA graph can hold them):
* `sorted_ids` int32 [max_blocks * block_m]: a pair id, or the sentinel `M * top_k` in padding;
  the order of pairs inside one expert's segment is unspecified (the kernel fills it with atomics).
* `expert_ids` int32 [max_blocks]: the expert of each block, -1 past the last used block.
* `num_post_padded` int32 [1]: number of used slots (a multiple of block_m).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    triton = None
    tl = None
    HAS_TRITON = False


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
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts  # unpadded start of each expert in sorted order
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank = torch.arange(numel, device=flat.device) - first[experts_sorted]
    sorted_ids = torch.full((nb * block_m,), numel, dtype=torch.int32, device=flat.device)
    sorted_ids[starts[experts_sorted] + rank] = order.to(torch.int32)
    blocks = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_m)
    expert_ids = torch.full((nb,), -1, dtype=torch.int32, device=flat.device)
    expert_ids[: blocks.numel()] = blocks.to(torch.int32)
    num_post = padded.sum().to(torch.int32).reshape(1)
    return sorted_ids, expert_ids, num_post


if HAS_TRITON:

    @triton.jit(do_not_specialize=["numel", "nb_max"])
    def _moe_align_kernel(
        TOPK, SORTED, EXPERT_IDS, NUM_POST, CURSOR,
        numel, num_experts, nb_max,
        BM: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr, BLOCK_B: tl.constexpr,
    ):
        # One program: counts, padded offsets, block -> expert table, then an atomic scatter.
        e_offs = tl.arange(0, E_POW2)
        counts = tl.zeros((E_POW2,), dtype=tl.int32)
        for start in range(0, numel, CHUNK):
            offs = start + tl.arange(0, CHUNK)
            m = offs < numel
            ids = tl.load(TOPK + offs, mask=m, other=0).to(tl.int32)
            counts += tl.histogram(ids, E_POW2, mask=m)
        padded = (counts + BM - 1) // BM * BM
        ends = tl.cumsum(padded, 0)
        total = tl.sum(padded, 0)
        tl.store(NUM_POST, total)
        tl.store(CURSOR + e_offs, ends - padded, mask=e_offs < num_experts)
        for b0 in range(0, nb_max, BLOCK_B):
            b = b0 + tl.arange(0, BLOCK_B)
            pos = b * BM
            # the expert owning slot `pos` is the number of segments that end at or before it
            eid = tl.sum((ends[None, :] <= pos[:, None]).to(tl.int32), axis=1)
            eid = tl.where(pos < total, eid, -1)
            tl.store(EXPERT_IDS + b, eid, mask=b < nb_max)
        for p0 in range(0, nb_max * BM, CHUNK):
            p = p0 + tl.arange(0, CHUNK)
            tl.store(SORTED + p, numel, mask=p < nb_max * BM)
        tl.debug_barrier()  # cursor and sentinel stores must land before the scatter
        for start in range(0, numel, CHUNK):
            offs = start + tl.arange(0, CHUNK)
            m = offs < numel
            ids = tl.load(TOPK + offs, mask=m, other=0).to(tl.int32)
            slot = tl.atomic_add(CURSOR + ids, 1, mask=m)
            tl.store(SORTED + slot, offs, mask=m)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Triton version of `moe_align_ref` (one launch); ids must lie in [0, num_experts)."""
    _check(topk_ids, num_experts, block_m)
    flat = topk_ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    numel = flat.numel()
    nb = max_blocks(numel, num_experts, block_m)
    dev = topk_ids.device
    sorted_ids = torch.empty((nb * block_m,), dtype=torch.int32, device=dev)
    expert_ids = torch.empty((nb,), dtype=torch.int32, device=dev)
    num_post = torch.empty((1,), dtype=torch.int32, device=dev)
    cursor = torch.empty((num_experts,), dtype=torch.int32, device=dev)
    e_pow2 = triton.next_power_of_2(num_experts)
    _moe_align_kernel[(1,)](
        flat, sorted_ids, expert_ids, num_post, cursor, numel, num_experts, nb,
        BM=block_m, E_POW2=e_pow2, CHUNK=1024, BLOCK_B=max(16, 8192 // e_pow2), num_warps=8,
    )
    return sorted_ids, expert_ids, num_post
