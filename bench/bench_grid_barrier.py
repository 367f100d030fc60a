"""What a stage boundary costs in a B = 1 decode step (issue #6): a launch, or a grid barrier?

A chain of S one-row FP8 linears y_{s+1} = W_s · y_s (D x D, FP8 weights with 128 x 128 scales, the activation
quantised per 128 as `fp8_linear_ref` does, bf16 between stages), timed three ways in one CUDA graph each:

  launches   S launches of the model's one-row GEMV (`fp8_gemv`, split-K, PDL on)
  persistent one cooperative launch: every program loops over the S stages and meets the others at
             `grid_barrier` between them; split-K partials go through global memory and the next stage sums them
  + l2       the same, each program starting its next-stage weights into L2 before it waits at the barrier

and, as floors, S launches of a plain read of each weight. The per-stage difference between the rows is the
price of a boundary. Outputs are checked against the chain of `fp8_gemv` calls.

    python bench/bench_grid_barrier.py [--dims 1024,2048,4096] [--stages 8]
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
from dsv4.kernels._triton import prefetch_l2  # noqa: E402
from dsv4.kernels.fp8_gemv import fp8_gemv  # noqa: E402
from dsv4.kernels.fp8_linear import _e4m3, _pow2_scale  # noqa: E402
from dsv4.kernels.grid_barrier import barrier_counter, grid_barrier, resident_programs  # noqa: E402

DEV = "cuda"


@triton.jit
def _chain_kernel(X, W, SW, P, Y, CNT, D, S: tl.constexpr, BN: tl.constexpr, KU: tl.constexpr,
                  SPLIT: tl.constexpr, L2: tl.constexpr):
    BK: tl.constexpr = 128
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    kb_total = D // BK
    kb_per = kb_total // SPLIT
    items = (D // BN) * SPLIT
    ku = tl.arange(0, KU)
    cols = tl.arange(0, BK)
    for s in tl.static_range(S):
        w_stage = W + s * D * D
        for it in range(pid, items, nprog):
            t = it // SPLIT
            sp = it % SPLIT
            rows = t * BN + tl.arange(0, BN)
            acc = tl.zeros((BN,), dtype=tl.float32)
            for kb in range(sp * kb_per, (sp + 1) * kb_per, KU):
                w = tl.load(w_stage + rows[:, None, None].to(tl.int64) * D + kb * BK + ku[None, :, None] * BK
                            + cols[None, None, :])
                sw = tl.load(SW + s * (D // BK) * kb_total + (t * BN // BK) * kb_total + kb + ku)
                xoff = kb * BK + ku[:, None] * BK + cols[None, :]
                if s == 0:
                    x = tl.load(X + xoff).to(tl.float32)
                else:  # the previous stage's split-K partials, summed in split order, rounded to bf16
                    x = tl.zeros((KU, BK), dtype=tl.float32)
                    for q in range(SPLIT):
                        x += tl.load(P + ((s - 1) % 2) * SPLIT * D + q * D + xoff, cache_modifier=".cg")
                    x = x.to(tl.bfloat16).to(tl.float32)
                amax = tl.maximum(tl.max(tl.abs(x), axis=1), 1e-4)
                sx, inv = _pow2_scale(amax)
                xq = _e4m3(tl.clamp(x * inv[:, None], -448.0, 448.0)).to(tl.float32)
                part = tl.sum(w.to(tl.float32) * xq[None, :, :], axis=2)
                acc += tl.sum(part * (sw * sx)[None, :], axis=1)
            tl.store(P + (s % 2) * SPLIT * D + sp * D + rows, acc)
        if L2 and s + 1 < S:  # this program's first item of the next stage
            it0 = pid % items
            rows0 = (it0 // SPLIT) * BN + tl.arange(0, BN)
            prefetch_l2(W + (s + 1) * D * D + (it0 % SPLIT) * kb_per * BK, rows0.to(tl.int64) * D, kb_per * BK)
        grid_barrier(CNT)
    for t in range(pid, D // BN, nprog):
        rows = t * BN + tl.arange(0, BN)
        y = tl.zeros((BN,), dtype=tl.float32)
        for q in range(SPLIT):
            y += tl.load(P + ((S - 1) % 2) * SPLIT * D + q * D + rows, cache_modifier=".cg")
        tl.store(Y + rows, y.to(tl.bfloat16))


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
        self.p = torch.empty(2, self.split, d, device=DEV)
        self.y = torch.empty(d, device=DEV, dtype=torch.bfloat16)
        self.warps = warps
        dummy = torch.zeros(1, dtype=torch.int64, device=DEV)
        probe = _chain_kernel.warmup(self.x, self.ws[0], self.ss[0], self.p, self.y, dummy, d, S=stages,
                                     BN=self.bn, KU=self.ku, SPLIT=self.split, L2=True, num_warps=warps,
                                     num_stages=1, launch_cooperative_grid=True, grid=(1,))
        self.fit = resident_programs(probe, sms)
        self.nprog = min(self.fit, sms * per_sm)
        self.regs = probe.n_regs
        self.cnt = barrier_counter("bench chain", torch.device(DEV), self.nprog)

    def persistent(self, i: int, l2: bool):
        _chain_kernel[(self.nprog,)](self.x, self.ws[i], self.ss[i], self.p, self.y, self.cnt, self.d, S=self.s,
                                     BN=self.bn, KU=self.ku, SPLIT=self.split, L2=l2, num_warps=self.warps,
                                     num_stages=1, launch_cooperative_grid=True)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="1024,2048,4096")
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--per-sm", default="1,2,4,8", help="programs per SM to try (capped by what fits)")
    ap.add_argument("--warps", type=int, default=4)
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    bw = copy_bandwidth()
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}; copy {bw:.2f} TB/s; "
          f"{args.stages} stages per chain", flush=True)
    print("D | MB/stage | programs | regs | launches µs/stage | persistent | + l2 | read floor | bytes@copy | "
          "rel.err", flush=True)
    out = torch.empty(1 << 16, dtype=torch.int32, device=DEV)
    for d in (int(v) for v in args.dims.split(",")):
        copies = max(2, -(-4 * L2_BYTES // (args.stages * d * d)))
        for per_sm in (int(v) for v in args.per_sm.split(",")):
            ch = Chain(d, args.stages, copies, sms, per_sm, args.warps)
            ref = ch.launches(0).float()
            got = ch.persistent(0, False).float()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            got_l2 = ch.persistent(0, True).float()
            err = max(err, ((got_l2 - ref).abs().max() / ref.abs().max()).item())
            per = args.stages
            t_launch = graph_us([lambda i=i: ch.launches(i) for i in range(copies)]) / per
            t_pers = graph_us([lambda i=i: ch.persistent(i, False) for i in range(copies)]) / per
            t_l2 = graph_us([lambda i=i: ch.persistent(i, True) for i in range(copies)]) / per
            t_read = graph_us([lambda i=i: ch.reads(i, out) for i in range(copies)]) / per
            print(f"{d} | {d * d / 1e6:.1f} | {ch.nprog} ({ch.fit} fit) | {ch.regs} | {t_launch:.2f} | "
                  f"{t_pers:.2f} | {t_l2:.2f} | {t_read:.2f} | {d * d / (bw * 1e6):.2f} | {err:.1e}", flush=True)
            if ch.nprog == ch.fit:
                break
            del ch
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
