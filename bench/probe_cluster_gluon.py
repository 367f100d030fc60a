"""Offline probe (no GPU): what Gluon (Triton 3.6) offers for a two-CTA cluster kernel, e.g. for sharing one
expert's FP8 re-encode between its two M tiles (docs/kernels_e2e_notes.md, session 41).

    python bench/probe_cluster_gluon.py

Compiles a small kernel for sm_90a with num_ctas 1 and 2 and prints what the PTX shows: with num_ctas = 2 every
layout needs a CTA basis (`cga_layout=[[0]]`: each CTA holds the whole tensor), the kernel is marked
`.reqnctapercluster 2`, `gl.program_id(0)` reads %clusterid.x and an inline `mov.u32 $0, %cluster_ctarank` gives the
CTA's rank. What it lacks: the shared-memory address of an allocation, which a store to the peer CTA
(`mapa` + `st.shared::cluster`, or `cp.async.bulk.shared::cluster`) needs; the PTX addresses the one `global_smem`
array at offsets that the allocator assigns after the Python trace.
"""
from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource


@gluon.jit
def _probe(X, Y, CTAS: gl.constexpr):
    lay: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[0]] if CTAS == 2 else [])
    offs = gl.arange(0, 128, layout=lay)
    rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [offs], dtype=gl.int32, is_pure=True,
                                     pack=1)
    buf = gl.allocate_shared_memory(gl.int32, [128], gl.SwizzledSharedLayout(1, 1, 1, order=[0],
                                                                 cga_layout=[[0]] if CTAS == 2 else []))
    buf.store(gl.load(X + gl.program_id(0) * 256 + rank * 128 + offs))
    gl.store(Y + gl.program_id(0) * 256 + rank * 128 + offs, buf.load(lay) + rank)


def main() -> None:
    for ctas in (1, 2):
        src = GluonASTSource(fn=_probe, signature={"X": "*i32", "Y": "*i32", "CTAS": "constexpr"},
                             constexprs={"CTAS": ctas}, attrs={})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_ctas=ctas)).asm["ptx"]
        lines = [ln.strip() for ln in ptx.splitlines()
                 if re.search(r"cluster|ctaid|global_smem\[", ln) and not ln.lstrip().startswith((".loc", ".file"))]
        print(f"num_ctas {ctas}:", "; ".join(dict.fromkeys(lines)))


if __name__ == "__main__":
    main()
