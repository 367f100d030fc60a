"""Launch shapes of the Gluon prefill MoE (`dsv4.kernels.moe_wide_async`), each GEMM timed alone, Flash experts:

    python bench/bench_moe_wide_shapes.py [--ms 4096,8192] [--shapes 128,8,smem,4 64,4,reg,4 ...]

A shape is `bn,warps,mode,stages`: weight rows per program, warps, where the widened weights go (reg: the
MMA's register operand; smem: shared memory; split: registers, the GLU's gate and up rows of bn / 2 channels
in one tile, one warpgroup each) and ring slots. The question it was written for (session 10):
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
    import importlib

    from dsv4.kernels.moe_align import moe_align
    from dsv4.kernels.moe_wide import launch_args

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ms", default="4096,8192")
    p.add_argument("--bm", type=int, default=128)
    p.add_argument("--module", default="dsv4.kernels.moe_wide_async", help="the Gluon kernels' module (an A/B "
                   "against a saved copy of an earlier version)")
    p.add_argument("--shapes", nargs="+", default=["128,8,smem,4", "128,8,reg,4", "64,4,reg,4", "64,4,smem,4",
                                                    "64,4,reg,3", "64,4,smem,3"])
    a = p.parse_args()
    moe_wide_async = importlib.import_module(a.module)
    e, d, i, k = MOE["flash"]
    ex = random_experts(e, d, i, "mxfp4")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    t_flush = triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
    # mode "split": the GLU's gate and up rows of bn / 2 channels in one tile, a warpgroup each (moe_wide_async)
    shapes = [(int(b), int(w), m, int(s)) for b, w, m, s in (x.split(",") for x in a.shapes)]
    print("M | shape (bn,warps,mode,stages) | GLU ms | GEMM2 ms | sum | z same as first | GEMM2 same as first | "
          "regs GLU/GEMM2 | shared KB GLU/GEMM2")
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
            b, w_, mode, st = shapes[0]
            split = mode == "split"
            moe_wide_async.launch(args1, (nb, i // (b // 2 if split else b)), a.bm, b, True, w_, st, mode == "smem",
                                  **({'split': True} if split else {}))
        z_first = None
        for bn, warps, mode, stages in shapes:
            smem, split = mode == "smem", mode == "split"

            def glu():
                return moe_wide_async.launch(args1, (nb, i // (bn // 2 if split else bn)), a.bm, bn, True, warps,
                                             stages, smem, **({'split': True} if split else {}))

            def down():
                return moe_wide_async.launch(args2, (nb, d // bn), a.bm, bn, False, warps, stages, smem and not split)

            try:
                kernels = [glu(), None]
                z = args1[3]
                z_same = "-" if z_first is None else f"{float((z == z_first).double().mean()):.4f}"
                z_first = z.clone() if z_first is None else z_first
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
                print(f"{m} | {bn},{warps},{mode},{stages} | {times[0]:.2f} | {times[1]:.2f} | "
                      f"{sum(times):.2f} | {z_same} | {same} | {regs} | {shm}", flush=True)
            except Exception as err:  # a shape that does not compile or fit: say so, go on
                print(f"{m} | {bn},{warps},{mode},{stages} | ERR {str(err)[:160]}", flush=True)


if __name__ == "__main__":
    main()
