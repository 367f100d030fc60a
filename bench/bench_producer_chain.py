"""Does a producer warp make a persistent chain fast (issue #6)? The chain of one-row FP8 linears of
bench_grid_barrier.py, timed as S launches of the model's GEMV (`fp8_gemv`, PDL) and as one warp-specialised Gluon
kernel whose producer warp streams every stage's weights into shared memory ahead of the consumers
(bench/producer_chain.py), µs per stage in one CUDA graph each, beside the bytes at copy bandwidth. The check: the
chain's output against the launches' (another fp32 summation order: a tolerance), printed per row; run it at 1 and
2 stages too (a hand-off race shows from the second stage on as an error of 0.1 and more).

    python bench/bench_producer_chain.py [--dims 1024,2048,4096] [--stages 8] [--ring 16] [--bn 64]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_grid_barrier import Chain  # noqa: E402
from bench.producer_chain import chain_shape, producer_chain_kernel, weight_descriptor  # noqa: E402
from bench.sweep_linear import L2_BYTES, copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels.grid_barrier import barrier_counter  # noqa: E402

DEV = "cuda"


class ProducerChain:
    def __init__(self, ch: Chain, programs: int, bn: int, ring: int):
        self.ch, self.programs, self.bn, self.ring = ch, programs, bn, ring
        self.split, self.per = chain_shape(ch.d, programs, bn)
        self.descs = [weight_descriptor(w, bn) for w in ch.ws]
        self.p = torch.empty(2, self.split, ch.d, device=DEV)
        self.y = torch.empty(ch.d, device=DEV, dtype=torch.bfloat16)
        self.cnt = barrier_counter("bench producer chain", torch.device(DEV), programs)

    def __call__(self, i: int) -> torch.Tensor:
        ch = self.ch
        producer_chain_kernel[(self.programs,)](ch.x, self.descs[i], ch.ss[i], self.p, self.y, self.cnt, ch.s, ch.d,
                                                self.per, SPLIT=self.split, BN=self.bn, KB_PER=ch.d // 128 // self.split,
                                                R=self.ring, num_warps=4,
                                                launch_cooperative_grid=True)
        return self.y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", default="1024,2048,4096")
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--ring", type=int, default=16, help="shared-memory slots of [bn, 128] weight bytes")
    ap.add_argument("--bn", type=int, default=64)
    ap.add_argument("--programs", type=int, default=128, help="one per SM (the tiles must split evenly over them)")
    args = ap.parse_args()
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    print(f"{props.name}, torch {torch.__version__}, triton {triton.__version__}; copy {bw:.2f} TB/s; "
          f"{args.stages} stages, {args.programs} programs, ring {args.ring} x [{args.bn}, 128]", flush=True)
    print("D | MB/stage | launches µs/stage | producer chain µs/stage | bytes@copy | rel.err vs launches", flush=True)
    for d in (int(v) for v in args.dims.split(",")):
        copies = max(2, -(-4 * L2_BYTES // (args.stages * d * d)))
        ch = Chain(d, args.stages, copies, props.multi_processor_count, 1, 4)
        try:
            pc = ProducerChain(ch, args.programs, args.bn, args.ring)
            ref = ch.launches(0).float()
            err = ((pc(0).float() - ref).abs().max() / ref.abs().max()).item()
            t_prod = graph_us([lambda i=i: pc(i) for i in range(copies)]) / args.stages
        except (RuntimeError, ValueError) as e:
            print(f"{d} | producer chain failed: {str(e)[:160]}", flush=True)
            continue
        t_launch = graph_us([lambda i=i: ch.launches(i) for i in range(copies)]) / args.stages
        print(f"{d} | {d * d / 1e6:.1f} | {t_launch:.2f} | {t_prod:.2f} | {d * d / (bw * 1e6):.2f} | {err:.1e}",
              flush=True)
        del ch, pc
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
