"""Pull a tensor's bytes into the GPU's L2 ahead of the kernel that reads them (decode-time weights).

A decode step at batch 1 alternates weight-streaming GEMMs with kernels that leave HBM almost idle
(attention, mHC, norms, the indexer). Issued on a side stream beside those, `prefetch_l2` lets the next
GEMM's weight arrive in L2 while HBM would otherwise wait. Hopper's bulk prefetch
(`cp.async.bulk.prefetch.L2`, one instruction per CHUNK bytes) is a hint: it changes no value, so the
torch reference is a no-op, and a prefetch that is evicted before use costs only bandwidth.
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON, tl, triton  # noqa: F401

CHUNK = 16384  # bytes per bulk prefetch (a multiple of 16)
CHUNKS_PER_PROGRAM = 128  # one per thread of a 4-warp program


def prefetch_l2_ref(t: torch.Tensor) -> None:
    """Reference: nothing to compute (a prefetch only moves bytes between memory levels)."""
    del t


if HAS_TRITON:

    @triton.jit
    def _prefetch_l2_kernel(SRC, nbytes, CHUNK_BYTES: tl.constexpr, PER_PROGRAM: tl.constexpr):
        offs = (tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)).to(tl.int64) * CHUNK_BYTES
        size = tl.minimum(nbytes - offs, CHUNK_BYTES)
        ok = (size > 0).to(tl.int32)
        tl.inline_asm_elementwise(
            asm="""
            {
            .reg .pred p;
            setp.ne.b32 p, $3, 0;
            @p cp.async.bulk.prefetch.L2.global [$1], $2;
            mov.u32 $0, 0;
            }
            """,
            constraints="=r,l,r,r",
            args=[SRC + offs, size.to(tl.int32), ok],
            dtype=tl.int32, is_pure=False, pack=1)


def prefetch_l2(t: torch.Tensor) -> None:
    """Hint the bytes of a contiguous CUDA tensor into L2 (no-op elsewhere; sizes rounded down to 16 B)."""
    if not (HAS_TRITON and t.is_cuda) or t.numel() == 0:
        return
    if not t.is_contiguous():
        raise ValueError(f"prefetch_l2: expected a contiguous tensor, got strides {t.stride()}")
    nbytes = (t.numel() * t.element_size()) // 16 * 16
    if nbytes == 0 or t.data_ptr() % 16:
        return
    grid = (triton.cdiv(nbytes, CHUNK * CHUNKS_PER_PROGRAM),)
    _prefetch_l2_kernel[grid](t.reshape(-1).view(torch.uint8), nbytes,
                              CHUNK_BYTES=CHUNK, PER_PROGRAM=CHUNKS_PER_PROGRAM, num_warps=4)
