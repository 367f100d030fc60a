"""Triton is optional: CPU-only machines (CI) import the kernels' torch references without it.

Programmatic dependent launch (PDL, Hopper): every kernel of this package starts with `grid_sync()`
and is launched with `**pdl()`. A PDL launch may start while the previous kernel is still finishing;
`grid_sync` makes each program wait there until that kernel's writes are visible (so nothing before
it may read another kernel's output or write memory), then lets the next kernel's programs be
scheduled. In a captured decode step this hides part of each node's launch latency (bench/pdl_probe.py:
≈ 0.93 -> 0.66 µs per dependent node on the H200). `DSV4_PDL=0` launches plainly (same results).
"""
from __future__ import annotations

import functools
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


@functools.cache
def pdl() -> dict:
    """Launch options: {"launch_pdl": True} on a Hopper-or-newer GPU unless DSV4_PDL=0, else {}."""
    if not HAS_TRITON or INTERPRET or os.environ.get("DSV4_PDL", "1") == "0":
        return {}
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        return {}
    return {"launch_pdl": True}


grid_sync = None  # replaced below where triton imports

if HAS_TRITON:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _GDC = tl.constexpr(not INTERPRET)  # the interpreter runs no inline PTX

    @triton.jit
    def grid_sync():
        """Wait for the previous kernel's writes, then let the next kernel launch (no-ops without PDL)."""
        if _GDC:
            gdc_wait()
            gdc_launch_dependents()
