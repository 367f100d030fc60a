"""Start weights on their way into L2 ahead of the kernel that reads them (a hint, no result).

`prefetch_l2_tensors(tensors, chunk)` issues Hopper bulk L2 prefetches (`cp.async.bulk.prefetch.L2`)
over every byte of each tensor, one launch per tensor; the launch ends once the prefetches are issued,
not when the bytes arrive. Meant for a side stream (dsv4.model.prefetch) while the main stream runs a
chain of small latency-bound kernels that leave DRAM idle: the next large GEMV then finds its weights
in L2 instead of streaming them. The torch reference is a no-op (nothing is computed or written), and
so is the kernel off CUDA or under the interpreter (the instruction is PTX).
"""
from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, tl, triton
from dsv4.kernels._triton import prefetch_l2

CHUNK = 16384  # bytes per prefetch instruction (a multiple of 16)
BLOCK = 128  # prefetch instructions per program


def prefetch_l2_tensors_ref(tensors: list[torch.Tensor], chunk: int = CHUNK) -> None:
    """The reference: a prefetch changes no value."""
    _check(tensors, chunk)


def _check(tensors: list[torch.Tensor], chunk: int) -> None:
    if chunk <= 0 or chunk % 16:
        raise ValueError(f"prefetch_l2_tensors: chunk must be a positive multiple of 16 bytes, got {chunk}")
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(f"prefetch_l2_tensors: tensors must be contiguous, got strides {t.stride()}")


def prefetch_l2_tensors(tensors: list[torch.Tensor], chunk: int = CHUNK) -> None:
    """Prefetch each contiguous tensor's bytes into L2 (tensors under 16 bytes are skipped). A tensor's
    last prefetch is moved back to end at its last 16-byte boundary (bulk prefetches are 16-byte
    aligned and sized); the few bytes past it are left to the reader."""
    _check(tensors, chunk)
    for t in tensors:
        if not (HAS_TRITON and t.is_cuda):
            continue
        nbytes = t.numel() * t.element_size() // 16 * 16
        if nbytes < 16 or t.data_ptr() % 16:
            continue
        size = min(chunk, nbytes)
        count = -(-nbytes // size)
        _prefetch_kernel[(triton.cdiv(count, BLOCK),)](t.view(-1).view(torch.uint8), count, nbytes - size,
                                                       SIZE=size, BLOCK=BLOCK, num_warps=4)


if HAS_TRITON:
    @triton.jit
    def _prefetch_kernel(BASE, COUNT, LAST, SIZE: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        offs = tl.minimum(i.to(tl.int64) * SIZE, LAST)  # programs past the end repeat the last chunk
        offs = tl.where(i < COUNT, offs, LAST)
        prefetch_l2(BASE, offs, SIZE)
