"""Triton is optional: CPU-only machines (CI) import the kernels' torch references without it."""
from __future__ import annotations

import functools
import inspect
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


def interpreted() -> bool:
    """Triton's CPU interpreter is on (the kernel tests): kernel-mode paths may take CPU tensors too."""
    return HAS_TRITON and INTERPRET


# Arrival counters for kernels whose last-arriving program finishes a reduction (the FP8 GEMM's split-K,
# the mHC split finish): int32, allocated zeroed once per (user, device) and left zeroed by every launch
# (the last arriver resets its counter), so no memset node per call. Never grown inside a CUDA-graph
# capture (the zero fill would not be replayed): the warm-up before a capture allocates them. A replaced
# buffer is kept alive, since captured graphs still point at it. Launches sharing a buffer must not
# overlap, so each lane of work that may run beside another (`dsv4.model.side_stream`: 0 = the current
# stream, 1-3 = side branches, `side_stream.LANES`) has its own buffers; within a lane the launches are stream-ordered.
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


# Programmatic dependent launch (PDL, Hopper): a kernel launched with it may be scheduled while the one
# before it in the stream is still running, and inside a CUDA graph the launch latency between the two
# goes. Its body must start with `pdl_wait()` (griddepcontrol.wait: the previous kernel has finished and
# its writes are visible), before which it may only touch what no earlier kernel writes -- the weights:
# the GEMMs start their weights' L2 prefetch there. Right after the wait it lets the next kernel be
# scheduled, so at most one kernel waits ahead. `pdl_kernel` launches an entry kernel this way and
# checks that its source calls `pdl_wait()`; DSV4_PDL=0 turns it off (the kernels then compile without the
# instructions, and the launchers ask for no prefetch).
PDL = HAS_TRITON and not INTERPRET and os.environ.get("DSV4_PDL", "1") != "0"
PREFETCH_KBLOCKS = 4  # 128-wide K blocks of a program's weight rows started into L2 before the wait (8: no better)
# Only for weights up to this size: in a chain of dependent one-row linears (bench_grid_barrier.py) the prefetch
# saves ≈ 0.3 µs per launch at 1 MB but costs 0.4 µs at 4.2 MB and 3.3 µs at 16.8 MB; 8 Flash layers' graph
# replay 1.31 -> 1.27 ms at B = 1 (docs/benchmarks.md, session 23).
PREFETCH_MAX_BYTES = 2 << 20


def weight_prefetch_kblocks(weight_bytes: int) -> int:
    """K blocks a PDL kernel's launcher asks it to prefetch before its wait (0 with PDL off, or for a weight
    of more than PREFETCH_MAX_BYTES)."""
    return PREFETCH_KBLOCKS if PDL and weight_bytes <= PREFETCH_MAX_BYTES else 0


class _PDLKernel:
    def __init__(self, fn):
        if "pdl_wait()" not in inspect.getsource(fn.fn):
            raise TypeError(f"{fn.__name__}: a pdl_kernel must call pdl_wait() before reading its inputs")
        self.fn = fn

    def __getitem__(self, grid):
        launch = self.fn[grid]
        return functools.partial(launch, launch_pdl=True) if PDL else launch

    def __getattr__(self, name):
        return getattr(self.fn, name)


def pdl_kernel(fn):
    """Decorator (above @triton.jit) for an entry kernel launched with PDL."""
    return _PDLKernel(fn)


if HAS_TRITON:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _PDL_ON = tl.constexpr(PDL)
    _COMPILED = tl.constexpr(not INTERPRET)  # inline PTX: not under Triton's CPU interpreter

    @triton.jit
    def pdl_wait():
        if _PDL_ON:
            gdc_wait()
            gdc_launch_dependents()

    @triton.jit
    def prefetch_l2(base, offs, nbytes):
        """Start loading nbytes (a multiple of 16) at each 16-byte aligned base + offs into L2 (a hint; the
        launchers decide whether to: before a PDL wait only while PDL is on)."""
        if _COMPILED:
            size = (offs * 0 + nbytes).to(tl.int32)
            tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                      [base + offs, size], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def mul_rn(x, y):
        """fp32 x * y rounded on its own: never folded into an fma (PTX's mul.rn is not contracted)."""
        if _COMPILED:
            return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [x, y], dtype=tl.float32,
                                             is_pure=True, pack=1)
        else:
            return x * y

    @triton.jit
    def rotate_pairs(a, c, cs, sn):
        """RoPE on the fp32 pairs (a, c): (a cs - c sn, a sn + c cs) with every product rounded, as torch computes
        it. Left to the compiler, which product of a pair gets folded into an fma followed the instruction order
        (moving a load changed a rotation's bits, session 44); every kernel that rotates calls this."""
        return mul_rn(a, cs) - mul_rn(c, sn), mul_rn(a, sn) + mul_rn(c, cs)

    @triton.jit
    def split_k_sum(P, CNT, tile, pid_k, split, vals, offs, stride_ps):
        """Split K inside one launch: store this split's fp32 partial at P + offs + pid_k * stride_ps and count
        the arrival on CNT[tile]; returns (whether this program arrived last, and then the `split` partials
        summed in split order from 0.0 -- the same bits whoever arrives last). Ordering: the CTA barrier puts
        every thread's partial stores before the one gpu-scope acq_rel atomic; in the last arriver a second
        barrier puts its partial loads after it, read past the non-coherent L1 (.cg). The last arriver resets
        the counter for the next launch / graph replay (see `arrival_counters`)."""
        tl.store(P + pid_k * stride_ps + offs, vals)
        tl.debug_barrier()
        arrived = tl.atomic_add(CNT + tile, 1, sem="acq_rel", scope="gpu")
        last = arrived == split - 1
        total = tl.zeros_like(vals)
        if last:
            tl.debug_barrier()
            for s in range(0, split):
                total += tl.load(P + s * stride_ps + offs, cache_modifier=".cg")
            tl.store(CNT + tile, 0)
        return last, total
else:  # pragma: no cover - CPU-only machines
    pdl_wait = prefetch_l2 = split_k_sum = mul_rn = rotate_pairs = None

if HAS_TRITON and not INTERPRET:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def gluon_pdl_wait():
        """`pdl_wait` in a Gluon kernel (its instructions unconditional: harmless in a launch without PDL)."""
        gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
else:  # pragma: no cover - no Gluon under the interpreter
    gluon_pdl_wait = None
