"""A grid-wide barrier for persistent Triton kernels (not used by the model; bench/bench_grid_barrier.py).

Why it exists: a B = 1 decode step is ≈ 25 kernels per layer, each ≈ 3 µs beyond its bytes (docs/benchmarks.md,
session 17), and a kernel whose programs stay resident across dependent stages could replace launches by
barriers. Measured (session 23): a barrier costs ≈ 1.1 µs at up to 528 programs, as much as a PDL launch in a
CUDA graph, so it pays only together with work that overlaps the boundary (the next stages' weights streaming
in); docs/kernels_e2e_notes.md "Session 23".

Safety: a spin barrier deadlocks unless every program of the grid is resident at once. `launch_cooperative_grid`
makes the driver guarantee it (the launch fails, instead of hanging, if the grid does not fit). Triton's CPU
interpreter runs programs one after another, so kernels using it are GPU-only.

Counter: one int64 per barrier user, zeroed once and never reset. Every program adds 1 per barrier, so the
count only grows; a program that arrives as the `old`-th waits until the count reaches the end of its round,
(old // nprog + 1) * nprog. All launches sharing a counter must use the same grid size (the rounds stay
aligned), hence one counter per (user, device, grid size).
"""

from __future__ import annotations

from dsv4.kernels._triton import HAS_TRITON, INTERPRET, tl, triton

_counters: dict = {}


def barrier_counter(user: str, device, nprog: int):
    """The zeroed int64 counter of `user`'s cooperative launches of `nprog` programs on `device`."""
    import torch
    key = (user, device, nprog)
    if key not in _counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise ValueError(f"{user}: the grid barrier's counter must be allocated before CUDA-graph capture")
        _counters[key] = torch.zeros(1, dtype=torch.int64, device=device)
    return _counters[key]


def resident_programs(kernel, num_sms: int) -> int:
    """Programs of a compiled Triton kernel that fit on the GPU at once (registers, shared memory, warps)."""
    kernel._init_handles()  # loads the binary: its register count
    warps = kernel.metadata.num_warps
    per_warp = -(-max(1, kernel.n_regs) * 32 // 256) * 256  # registers are allocated per warp, 256 at a time
    by_regs = 65536 // (per_warp * warps)
    by_smem = (228 * 1024) // max(1, kernel.metadata.shared + 1024)
    return num_sms * max(0, min(by_regs, by_smem, 64 // warps, 32))


def arrive_and_wait_asm(cta_barrier: str = "bar.sync 0") -> str:
    """PTX of the barrier: one thread per program arrives (a release add) and polls (acquire loads) until the count
    reaches the end of its round; `cta_barrier` before and after holds the program's other threads (a named
    barrier such as "bar.sync 15, 128" where only some warps take part: a warp-specialised kernel's consumers).
    All of it is one asm statement: with Triton's own CTA barrier (`tl.debug_barrier`) inside a loop, the software
    pipeliner leaves the loop's loads unpipelined. Labels inside { } are local to the block, so the asm may be
    inlined many times (as CUTLASS's barrier waits are)."""
    return f"""{{
    .reg .pred P1;
    .reg .b32 T;
    .reg .b64 OLD, TGT, C;
    {cta_barrier};
    mov.u32 T, %tid.x;
    setp.ne.u32 P1, T, 0;
    @P1 bra DONE;
    atom.release.gpu.global.add.u64 OLD, [$1], 1;
    div.u64 TGT, OLD, $2;
    add.u64 TGT, TGT, 1;
    mul.lo.u64 TGT, TGT, $2;
    LAB_WAIT:
    ld.acquire.gpu.global.u64 C, [$1];
    setp.lt.u64 P1, C, TGT;
    @P1 bra LAB_WAIT;
    DONE:
    {cta_barrier};
    mov.u32 $0, 0;
    }}"""


if HAS_TRITON and not INTERPRET:

    _ARRIVE_AND_WAIT = tl.constexpr(arrive_and_wait_asm())

    @triton.jit
    def grid_barrier(CNT):
        """Every program of the (cooperative) grid waits here until all have arrived; call it where the whole
        program runs it (uniform control flow). Ordering: the first CTA barrier puts all threads' earlier stores
        before the one thread's release add; its acquire loads and the second CTA barrier put every thread's
        later loads after all programs' arrivals (read data written by other programs with .cg: L1 is not
        coherent). Returns 0: inside a software-pipelined loop, add it to the addresses read after the barrier,
        since Triton's pipeliner may move other side-effecting asm (loads) above it otherwise (session 24)."""
        nprog = (tl.num_programs(0) * tl.num_programs(1)).to(tl.int64)
        return tl.inline_asm_elementwise(_ARRIVE_AND_WAIT, "=r,l,l", [CNT, nprog], dtype=tl.int32, is_pure=False,
                                         pack=1)
else:  # pragma: no cover - CPU-only machines, and the interpreter (which runs programs one at a time)
    grid_barrier = None
