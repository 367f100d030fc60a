"""What a stage boundary costs in a B = 1 decode step (issue #6): a launch, or a grid barrier?

A chain of S one-row FP8 linears y_{s+1} = W_s · y_s (D x D, FP8 weights with 128 x 128 scales, the activation
quantised per 128 as `fp8_linear_ref` does, bf16 between stages), timed four ways in one CUDA graph each:

  launches      S launches of the model's one-row GEMV (`fp8_gemv`, split-K, PDL as the model runs it)
  persistent    one cooperative launch: every program loops over the S stages and meets the others at
                `grid_barrier` between them; split-K partials go through global memory and the next stage sums them
  + l2          the same, each program starting its next-stage weights into L2 before it waits at the barrier
  + registers   the same, each program loading its first next-stage weight tile into registers before it waits

and, as floors, S launches of a plain read of each weight. The per-stage difference between the rows is the
price of a boundary. Outputs are checked against the chain of `fp8_gemv` calls (and the persistent variants
against each other, bit for bit). First, the barrier alone and an empty PDL launch, per grid size.
Session 23's figures: docs/benchmarks.md. (Session 24 measured and removed a fifth, a tensor-core chain in one
flat loop that Triton's pipeliner streamed through shared memory across the barriers: wrong from the second stage
on and 1.5-2.5x slower than the launches; docs/benchmarks.md "Session 24".)

    python bench/bench_grid_barrier.py [--dims 1024,2048,4096] [--stages 8] [--per-sm 2,4]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.sweep_gemv import _read_kernel  # noqa: E402
from bench.sweep_linear import L2_BYTES, copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels._triton import pdl_kernel, pdl_wait, prefetch_l2  # noqa: E402
from dsv4.kernels.fp8_gemv import fp8_gemv  # noqa: E402
from dsv4.kernels.fp8_linear import _e4m3, _pow2_scale  # noqa: E402
from dsv4.kernels.grid_barrier import barrier_counter, grid_barrier, resident_programs  # noqa: E402

DEV = "cuda"


@triton.jit
def _chain_output(P, Y, D, pid, nprog, S: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    """After the last barrier: the last stage's split-K partials summed in split order, as bf16."""
    for t in range(pid, D // BN, nprog):
        rows = t * BN + tl.arange(0, BN)
        y = tl.zeros((BN,), dtype=tl.float32)
        for q in range(SPLIT):
            y += tl.load(P + ((S - 1) % 2) * SPLIT * D + q * D + rows, cache_modifier=".cg")
        tl.store(Y + rows, y.to(tl.bfloat16))


@triton.jit
def _chain_item(X, W, SW, P, D, w, s: tl.constexpr, it, BN: tl.constexpr, KU: tl.constexpr, SPLIT: tl.constexpr):
    """One work item of stage s: BN output rows x the K step of split `it % SPLIT` (KU blocks), weight tile w."""
    BK: tl.constexpr = 128
    kb_total = D // BK
    t = it // SPLIT
    sp = it % SPLIT
    ku = tl.arange(0, KU)
    cols = tl.arange(0, BK)
    rows = t * BN + tl.arange(0, BN)
    kb = sp * KU
    sw = tl.load(SW + s * (D // BK) * kb_total + (t * BN // BK) * kb_total + kb + ku)
    xoff = kb * BK + ku[:, None] * BK + cols[None, :]
    if s == 0:
        x = tl.load(X + xoff).to(tl.float32)
    else:  # the previous stage's split-K partials, summed in split order, rounded to bf16
        x = tl.zeros((KU, BK), dtype=tl.float32)
        for q in tl.static_range(SPLIT):  # unrolled: the loads go out together
            x += tl.load(P + ((s - 1) % 2) * SPLIT * D + q * D + xoff, cache_modifier=".cg")
        x = x.to(tl.bfloat16).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
    sx, inv = _pow2_scale(amax)
    xq = _e4m3(tl.clamp(x * inv[:, None], -448.0, 448.0)).to(tl.float32)
    part = tl.sum(w.to(tl.float32) * xq[None, :, :], axis=2)
    tl.store(P + (s % 2) * SPLIT * D + sp * D + rows, tl.sum(part * (sw * sx)[None, :], axis=1))


@triton.jit
def _w_tile(W, D, s: tl.constexpr, it, BN: tl.constexpr, KU: tl.constexpr, SPLIT: tl.constexpr):
    BK: tl.constexpr = 128
    rows = (it // SPLIT) * BN + tl.arange(0, BN)
    return (W + s * D * D + rows[:, None, None].to(tl.int64) * D + (it % SPLIT) * KU * BK
            + tl.arange(0, KU)[None, :, None] * BK + tl.arange(0, BK)[None, None, :])


@triton.jit
def _chain_kernel(X, W, SW, P, Y, CNT, D, S: tl.constexpr, BN: tl.constexpr, KU: tl.constexpr,
                  SPLIT: tl.constexpr, L2: tl.constexpr, PRE_W: tl.constexpr):
    """S stages of D x D; each work item is one K step (KU == D / 128 / SPLIT, checked by the launcher)."""
    BK: tl.constexpr = 128
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    items = (D // BN) * SPLIT
    for s in tl.static_range(S):
        start = pid
        if PRE_W and s > 0:  # the first tile was loaded before the barrier
            if pid < items:
                _chain_item(X, W, SW, P, D, w_next, s, pid, BN, KU, SPLIT)
            start = pid + nprog
        for it in range(start, items, nprog):
            _chain_item(X, W, SW, P, D, tl.load(_w_tile(W, D, s, it, BN, KU, SPLIT)), s, it, BN, KU, SPLIT)
        if L2 and s + 1 < S:  # this program's first item of the next stage
            it0 = pid % items
            rows0 = (it0 // SPLIT) * BN + tl.arange(0, BN)
            prefetch_l2(W + (s + 1) * D * D + (it0 % SPLIT) * KU * BK, rows0.to(tl.int64) * D, KU * BK)
        if PRE_W and s + 1 < S:  # this program's first weight tile of the next stage, into registers
            w_next = tl.load(_w_tile(W, D, s + 1, pid, BN, KU, SPLIT), mask=pid < items, other=0.0)
        grid_barrier(CNT)
    _chain_output(P, Y, D, pid, nprog, S, BN, SPLIT)


def shape_for(d: int) -> tuple[int, int, int]:
    """(BN, KU, SPLIT): about 1024 work items of one 4-block (or smaller) K step each."""
    bn = 32 if d >= 2048 else 16
    kb = d // 128
    split = min(kb, max(1, 1024 // (d // bn)))
    return bn, min(4, kb // split), split


class Chain:
    def __init__(self, d: int, stages: int, copies: int, sms: int, per_sm: int, warps: int):
        self.d, self.s = d, stages
        self.ws = [(torch.randn(stages, d, d, device=DEV) * 0.5).to(torch.float8_e4m3fn) for _ in range(copies)]
        self.ss = [torch.exp2(torch.randint(-8, -4, (stages, d // 128, d // 128), device=DEV).float())
                   for _ in range(copies)]
        self.x = torch.randn(d, device=DEV).to(torch.bfloat16)
        self.bn, self.ku, self.split = shape_for(d)
        assert self.ku * self.split == d // 128, "one K step per work item"
        self.p = torch.empty(2, self.split, d, device=DEV)
        self.y = torch.empty(d, device=DEV, dtype=torch.bfloat16)
        self.warps = warps
        dummy = torch.zeros(1, dtype=torch.int64, device=DEV)
        probe = _chain_kernel.warmup(self.x, self.ws[0], self.ss[0], self.p, self.y, dummy, d, S=stages,
                                     BN=self.bn, KU=self.ku, SPLIT=self.split, L2=False, PRE_W=True, num_warps=warps,
                                     num_stages=1, launch_cooperative_grid=True, grid=(1,))
        self.fit = resident_programs(probe, sms)
        self.nprog = min(self.fit, sms * per_sm)
        self.regs = probe.n_regs
        self.cnt = barrier_counter("bench chain", torch.device(DEV), self.nprog)

    def persistent(self, i: int, l2: bool = False, pre_w: bool = False):
        _chain_kernel[(self.nprog,)](self.x, self.ws[i], self.ss[i], self.p, self.y, self.cnt, self.d, S=self.s,
                                     BN=self.bn, KU=self.ku, SPLIT=self.split, L2=l2, PRE_W=pre_w,
                                     num_warps=self.warps, num_stages=1, launch_cooperative_grid=True)
        return self.y

    def launches(self, i: int):
        y = self.x[None]
        for s in range(self.s):
            y = fp8_gemv(y, self.ws[i][s], self.ss[i][s])
        return y[0]

    def reads(self, i: int, out: torch.Tensor):
        kb = self.d // 128
        for s in range(self.s):
            w = self.ws[i][s]
            _read_kernel[(self.d // self.bn, self.split)](w.view(torch.uint8), out, w.stride(0), kb // self.split,
                                                          BN=self.bn, KU=self.ku, num_warps=4)


@triton.jit
def _barriers_kernel(CNT, R):
    for _ in range(R):
        grid_barrier(CNT)


@pdl_kernel
@triton.jit
def _empty_kernel(X):
    pdl_wait()
    tl.store(X + tl.program_id(0), 1)


def barrier_rows(sms: int, rounds: int = 64) -> None:
    """µs per grid barrier alone (R barriers in one launch), and per empty PDL launch, at each grid size."""
    x = torch.zeros(8 * sms, dtype=torch.int32, device=DEV)
    print("programs | µs per barrier (4 warps) | µs per barrier (1 warp) | µs per empty PDL launch", flush=True)
    for per_sm in (1, 2, 4, 8):
        n = per_sm * sms
        row = []
        for warps in (4, 1):
            cnt = barrier_counter("bench barriers", torch.device(DEV), n)
            t = graph_us([lambda: _barriers_kernel[(n,)](cnt, rounds, num_warps=warps, launch_cooperative_grid=True)])
            row.append(t / rounds)
        t_empty = graph_us([lambda: _empty_kernel[(n,)](x, num_warps=4) for _ in range(rounds)])
        print(f"{n} | {row[0]:.2f} | {row[1]:.2f} | {t_empty:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="1024,2048,4096")
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--per-sm", default="2,4", help="programs per SM to try (capped by what fits)")
    ap.add_argument("--warps", type=int, default=4)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    bw = copy_bandwidth()
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}; copy {bw:.2f} TB/s; "
          f"{args.stages} stages per chain", flush=True)
    barrier_rows(sms)
    print("D | MB/stage | programs | regs | launches µs/stage | persistent | + l2 | + w in registers | read floor | "
          "bytes@copy | rel.err vs fp8_gemv", flush=True)
    out = torch.empty(1 << 16, dtype=torch.int32, device=DEV)
    for d in (int(v) for v in args.dims.split(",")):
        copies = max(2, -(-4 * L2_BYTES // (args.stages * d * d)))
        for per_sm in (int(v) for v in args.per_sm.split(",")):
            ch = Chain(d, args.stages, copies, sms, per_sm, args.warps)
            try:
                ref = ch.launches(0).float()
                outs = [ch.persistent(0, **flags).float() for flags in (dict(), dict(l2=True), dict(pre_w=True))]
                # the variants sum in the same order (bit-identical); fp8_gemv's tiling may differ (fp32 order)
                same = all(torch.equal(o, outs[0]) for o in outs)
                err = ((outs[0] - ref).abs().max() / ref.abs().max()).item()
            except RuntimeError as e:
                print(f"{d} | {per_sm * sms} programs: {str(e)[:100]}", flush=True)
                continue
            per = args.stages
            t = [graph_us([lambda i=i: ch.launches(i) for i in range(copies)]) / per]
            for flags in (dict(), dict(l2=True), dict(pre_w=True)):
                t.append(graph_us([lambda i=i: ch.persistent(i, **flags) for i in range(copies)]) / per)
            t_read = graph_us([lambda i=i: ch.reads(i, out) for i in range(copies)]) / per
            print(f"{d} | {d * d / 1e6:.1f} | {ch.nprog} ({ch.fit} fit) | {ch.regs} | "
                  + " | ".join(f"{v:.2f}" for v in t) + f" | {t_read:.2f} | {d * d / (bw * 1e6):.2f} | {err:.1e}"
                  + ("" if same else " VARIANTS DIFFER"),
                  flush=True)
            del ch
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
