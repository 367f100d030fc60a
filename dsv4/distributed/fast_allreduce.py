"""All-reduce of small tensors through PyTorch's symmetric memory (`torch.distributed._symmetric_memory`).

One kernel per call (`one_shot_all_reduce_copy_out`): it copies this rank's tensor into its buffer that
the peers can read over NVLink, meets them at a device-side barrier, and sums the group's buffers into
the tensor. NCCL's all-reduce of one decode row measured ≈ 40 µs on 2×H200 (bench_parallel's ceilings,
sessions 9 and 15), and a sharded Flash decode step does two per layer (attention output, MoE combine).

Only groups of two ranks take this path: a + b is the same float on both ranks and equals NCCL's sum bit
for bit (NCCL and this kernel might add three or more partials in different orders). Larger tensors
(prefill) and other dtypes stay with NCCL. The choice depends only on the tensor's shape, dtype and
layout, so every rank of a lock-stepped run makes the same one. NVLink multicast is not used (it is not
needed by the one-shot kernel): TORCH_SYMM_MEM_DISABLE_MULTICAST is set before the buffers are made.
Opt-in until its two-GPU test has run (`DSV4_FAST_ALLREDUCE=1`; the two-GPU machines were not lent again
after it was written, session 16).
"""
from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

MAX_BYTES = 4 << 20  # a 128-row decode bucket's stacked MoE partials: 2 x 128 x 4096 fp32
DTYPES = (torch.float32, torch.bfloat16)
ALIGN = 16  # the kernel needs the tensor and its buffer view equally aligned: both at 16 bytes


def _supported() -> bool:
    return os.environ.get("DSV4_FAST_ALLREDUCE", "0") == "1" and torch.cuda.is_available() and hasattr(
        getattr(torch.ops, "symm_mem", None), "one_shot_all_reduce_copy_out")


class FastAllReduce:
    """In-place sum over a two-rank group for the CUDA tensors it `handles` (made by `build_fast_allreduce`)."""

    def __init__(self, group_name: str, buffers: dict[torch.dtype, torch.Tensor], max_bytes: int):
        self.group_name, self.buffers, self.max_bytes = group_name, buffers, max_bytes

    def handles(self, t: torch.Tensor) -> bool:
        return (t.is_cuda and t.dtype in self.buffers and t.is_contiguous() and 0 < t.nbytes <= self.max_bytes
                and t.nbytes % ALIGN == 0 and (t.storage_offset() * t.element_size()) % ALIGN == 0)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        # t is both the local input and the output: the kernel's thread that copies an element into the
        # buffer before the barrier is the one that writes its sum after it
        view = self.buffers[t.dtype][:t.numel()].view(t.shape)
        torch.ops.symm_mem.one_shot_all_reduce_copy_out(view, t, "sum", self.group_name, t)
        return t


def build_fast_allreduce(group, size: int, device: torch.device,
                         max_bytes: int = MAX_BYTES) -> FastAllReduce | None:
    """The fast path for `group` when it has two ranks on CUDA devices and every rank can allocate its
    buffers; None otherwise (NCCL then does all of the group's reductions). Every rank of the group must
    call it (the buffers' handles are exchanged)."""
    if size != 2 or device.type != "cuda" or not _supported():
        return None
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    from torch.distributed import _symmetric_memory as symm_mem
    try:  # one buffer per dtype: the kernel reads the peers' buffers in the tensor's dtype
        buffers = {dt: symm_mem.empty(max_bytes // dt.itemsize, dtype=dt, device=device) for dt in DTYPES}
    except Exception as e:  # noqa: BLE001 -- any failure here only means NCCL for everything
        log.warning("symmetric memory unavailable (%s): all-reduces go through NCCL", e)
        buffers = None
    flag = torch.tensor([int(buffers is not None)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)  # all ranks or none
    if not flag.item():
        return None
    for buf in buffers.values():
        symm_mem.rendezvous(buf, group.group_name)
    return FastAllReduce(group.group_name, buffers, max_bytes)
