"""Launch shapes of the Gluon prefill MoE (`dsv4.kernels.moe_wide_async`), each GEMM timed alone, Flash experts:

    python bench/bench_moe_wide_shapes.py [--ms 4096,8192] [--shapes 128,8,smem,4 64,4,reg,4 ...]

A shape is `bn,warps,mode,stages`: weight rows per program, warps, where the widened weights go (reg: the
MMA's register operand; smem: shared memory) and ring slots. The question it was written for (session 10):
does one warpgroup per program (bn 64, 4 warps, so two programs share an SM and one's widening overlaps the
other's MMAs without any synchronisation between them) beat two warpgroups in lockstep (bn 128, 8 warps)?
The GLU kernel quantises z over its bn channels, so at bn 64 its output is not the reference's (a GLU at
bn 64 would need a separate quantisation of z); the timing is what this measures, and GEMM2 (no such
epilogue) is checked against the first shape, both reading the first shape's z. Registers and shared memory per program come from the
compiled kernels. Times: triton's do_bench (median), L2 flushed (a 256 MB write before each call,
its own time subtracted). A development aid; docs/benchmarks.md cites the calls.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main() -> None:
    import triton

    from bench.bench_gemm_moe import MOE, random_experts
    from dsv4.kernels import moe_wide_async
    from dsv4.kernels.moe_align import moe_align
    from dsv4.kernels.moe_wide import launch_args

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ms", default="4096,8192")
    p.add_argument("--bm", type=int, default=128)
    p.add_argument("--shapes", nargs="+", default=["128,8,smem,4", "128,8,reg,4", "64,4,reg,4", "64,4,smem,4",
                                                    "64,4,reg,3", "64,4,smem,3"])
    a = p.parse_args()
    e, d, i, k = MOE["flash"]
    ex = random_experts(e, d, i, "mxfp4")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    t_flush = triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
    shapes = [(int(b), int(w), m == "smem", int(s)) for b, w, m, s in (x.split(",") for x in a.shapes)]
    print("M | shape (bn,warps,mode,stages) | GLU ms | GEMM2 ms | sum | GEMM2 same as first | regs GLU/GEMM2 | shared KB GLU/GEMM2")
    for m in (int(x) for x in a.ms.split(",")):
        gen = torch.Generator("cuda").manual_seed(m)
        x = torch.randn(m, d, device="cuda", generator=gen).to(torch.bfloat16)
        ids = torch.rand(m, e, device="cuda", generator=gen).topk(k, dim=1).indices
        w = torch.rand(m, k, device="cuda", generator=gen) + 0.1
        sorted_ids, expert_ids, num_post = moe_align(ids, e, a.bm)
        args1, args2, y = launch_args(x, sorted_ids, expert_ids, num_post, w, k, ex, 10.0, a.bm)
        nb = expert_ids.numel()
        first = None

        def ref_glu():
            b, w_, sm, st = shapes[0]
            moe_wide_async.launch(args1, (nb, i // b), a.bm, b, True, w_, st, sm)
        for bn, warps, smem, stages in shapes:
            def glu():
                return moe_wide_async.launch(args1, (nb, i // bn), a.bm, bn, True, warps, stages, smem)

            def down():
                return moe_wide_async.launch(args2, (nb, d // bn), a.bm, bn, False, warps, stages, smem)

            try:
                kernels = [glu(), None]
                ref_glu()  # GEMM2 reads the default shape's z, so its output is comparable
                y.fill_(float("nan"))
                kernels[1] = down()
                torch.cuda.synchronize()
                same = "-" if first is None else f"{float((y == first).double().mean()):.4f}"
                first = y.clone() if first is None else first
                times = []
                for f in (glu, down):
                    def flushed():
                        flush.zero_()
                        f()
                    times.append(triton.testing.do_bench(flushed, warmup=3, rep=30) - t_flush)
                regs = "/".join(str(getattr(c, "n_regs", "?")) for c in kernels)
                shm = "/".join(str(c.metadata.shared // 1024) for c in kernels)
                print(f"{m} | {bn},{warps},{'smem' if smem else 'reg'},{stages} | {times[0]:.2f} | {times[1]:.2f} | "
                      f"{sum(times):.2f} | {same} | {regs} | {shm}", flush=True)
            except Exception as err:  # a shape that does not compile or fit: say so, go on
                print(f"{m} | {bn},{warps},{'smem' if smem else 'reg'},{stages} | ERR {str(err)[:160]}", flush=True)


if __name__ == "__main__":
    main()
