"""What one dependent kernel costs inside a CUDA graph, with and without programmatic dependent
launch (PDL): a chain of N small Triton kernels (each reads the previous one's output) captured in
one graph, replayed; µs per node. A development aid for issue #6 (decode-step node overhead). Session 6
measured 0.93 -> 0.66 µs per node here but no gain in the real decode step; session 14's PDL (the weights'
L2 prefetch before the wait, `dsv4.kernels._triton.pdl_kernel`) took 7 % off the B = 1 step (docs/benchmarks.md).

    python bench/pdl_probe.py [--nodes 200] [--numel 8192] [--programs 16]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, os.path.dirname(__file__))
from bench_glue import graph_us  # noqa: E402


@triton.jit
def _step(X, Y, numel, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()  # the previous kernel's writes are visible after this
        gdc_launch_dependents()  # the next kernel's programs may be scheduled now
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(X + offs, mask=mask)
    tl.store(Y + offs, x * 0.5 + 1.0, mask=mask)


def chain(a, b, nodes, programs, pdl, torch_every=0):
    numel = a.numel()
    block = triton.next_power_of_2(triton.cdiv(numel, programs))
    grid = (triton.cdiv(numel, block),)
    src, dst = a, b
    for i in range(nodes):
        if torch_every and i % torch_every == torch_every - 1:
            torch.add(src, 1.0, out=dst)
        else:
            _step[grid](src, dst, numel, BLOCK=block, PDL=pdl, launch_pdl=pdl, num_warps=4)
        src, dst = dst, src
    return src


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--numel", type=int, default=8192)
    p.add_argument("--programs", type=int, default=16)
    args = p.parse_args()
    a = torch.randn(args.numel, device="cuda")
    b = torch.empty_like(a)
    ref = chain(a.clone(), b.clone(), args.nodes, args.programs, False)
    got = chain(a.clone(), b.clone(), args.nodes, args.programs, True)
    torch.cuda.synchronize()
    assert torch.equal(ref, got), "PDL chain differs from the plain chain"
    print(f"chain of {args.nodes} kernels, {args.numel} fp32, {args.programs} programs each, one graph")
    print(f"{'variant':34s} {'us/replay':>10} {'us/node':>8}")
    for name, pdl, every in (("plain", False, 0), ("PDL", True, 0), ("plain, every 4th a torch op", False, 4),
                             ("PDL, every 4th a torch op", True, 4)):
        us = graph_us(lambda: chain(a, b, args.nodes, args.programs, pdl, every), reps=50, calls=1)
        print(f"{name:34s} {us:10.1f} {us / args.nodes:8.2f}")


if __name__ == "__main__":
    main()
