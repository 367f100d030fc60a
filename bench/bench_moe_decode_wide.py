"""The routed MoE at decode sizes: the decode default (`moe_config`'s pick: the per-pair tensor-core kernels,
whose wgmmas each wait for the one before) against the prefill path's wide kernel (`moe_wide`, with
`moe_wide.ASYNC` its Gluon loop: the FP4 widening overlapped with asynchronous wgmma) forced at the same sizes,
and the per-group kernel. Flash experts, ms per call with L2 flushed (as bench_moe_flags.py), the share of
outputs bit-identical to the default's and the relative RMS difference.

    python bench/bench_moe_decode_wide.py [--ms 1,8,64] [--bm 16,64]
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
    from bench.bench_moe_flags import flushed_cell, routed_inputs
    from dsv4.kernels.moe import fused_moe
    from dsv4.kernels.moe_config import large_batch_config, wide_config

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ms", default="1,8,64")
    p.add_argument("--bm", default="16,64", help="token tiles of the wide kernel (16: the least padding at decode)")
    a = p.parse_args()
    e, d, i, k = MOE["flash"]
    ex = random_experts(e, d, i, "mxfp4")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    t_flush = triton.testing.do_bench(flush.zero_, warmup=3, rep=30)
    wide = [(f"wide bm {bm}", wide_config(bm)) for bm in map(int, a.bm.split(","))]
    variants = [("default", None), *wide, ("per-group", large_batch_config())]
    print("M | " + " | ".join(f"{name} ms (same, rel)" for name, _ in variants))
    for m in (int(x) for x in a.ms.split(",")):
        x, ids, w = routed_inputs(m, d, e, k)
        row, first = [], None
        for name, cfg in variants:
            try:
                cell, first = flushed_cell(lambda cfg=cfg: fused_moe(x, ids, w, ex, config=cfg), first, flush, t_flush)
                row.append(cell)
            except Exception as err:  # a variant that fails: say so, go on
                row.append(f"ERR {type(err).__name__}: {str(err)[:120]}")
        print(f"{m} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
