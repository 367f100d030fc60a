"""Triton is optional: CPU-only machines (CI) import the kernels' torch references without it."""
from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the machine
    triton = None
    tl = None
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# Arrival counters for kernels whose last-arriving program finishes a reduction (the FP8 GEMM's split-K,
# the mHC split finish): int32, allocated zeroed once per (user, device) and left zeroed by every launch
# (the last arriver resets its counter), so no memset node per call. Never grown inside a CUDA-graph
# capture (the zero fill would not be replayed): the warm-up before a capture allocates them. A replaced
# buffer is kept alive, since captured graphs still point at it. Launches sharing a buffer must not
# overlap, so each lane of work that may run beside another (`dsv4.model.side_stream`: 0 = the current
# stream, 1 = the side branch) has its own buffers; within a lane the launches are stream-ordered.
_COUNTER_MIN = 1 << 16
_counter_cache: dict = {}
counter_lane = 0  # set by dsv4.model.side_stream while it queues a side branch


def arrival_counters(user: str, device, needed: int):
    """A zeroed int32 buffer of at least `needed` counters for `user` on `device` (and the current lane)."""
    import torch
    bufs = _counter_cache.setdefault((user, device, counter_lane), [])
    if not bufs or bufs[-1].numel() < needed:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(f"{user}: arrival counters for {needed} programs must be allocated before CUDA-graph "
                             "capture; run the same shape once eagerly first")
        bufs.append(torch.zeros(max(_COUNTER_MIN, 1 << max(0, needed - 1).bit_length()), dtype=torch.int32,
                                device=device))
    return bufs[-1]
