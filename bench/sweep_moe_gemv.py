"""Decode-sized routed MoE (issue #5/#6, batch 1-8): the CUDA-core per-pair method with split-K
(`moe_gemv(method="cuda", split=, split_down=)`) against the tensor-core default (`pick_moe_config`), Flash
experts (256 x 4096 x 2048 MXFP4, random bytes), and a plain read of the bytes the pairs touch.

Timing as `sweep_linear.py`: `--calls` MoE calls with different random experts (together more than L2) in one
CUDA graph, µs per call. Prints the default, each CUDA-core shape and the best; the best shape as
`best: bn,unroll,split,split_down` on the last line.

    python bench/sweep_moe_gemv.py [--tokens 1] [--calls 16] [--mma [--stages 3,4] | --default-only]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.bench_gemm_moe import MOE, random_experts  # noqa: E402
from bench.sweep_linear import copy_bandwidth, graph_us  # noqa: E402
from dsv4.kernels.moe_config import pick_moe_config  # noqa: E402
from dsv4.kernels.moe_gemv import moe_gemv, pairs_fit  # noqa: E402

DEV = "cuda"
LIMIT = 10.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--mma", action="store_true", help="sweep the tensor-core method's launch shape instead")
    ap.add_argument("--dot-blocks", default="1,2", help="with --mma: the dot_blocks values to sweep")
    ap.add_argument("--stages", default="3", help="with --mma: the num_stages values to sweep")
    ap.add_argument("--default-only", action="store_true", help="time the default launch only (flag A/Bs)")
    args = ap.parse_args()
    e, d, i, k = MOE["flash"]
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.2f} TB/s ({torch.cuda.get_device_name()})", flush=True)
    experts = random_experts(e, d, i, "mxfp4")
    m = args.tokens
    gen = torch.Generator(DEV).manual_seed(0)
    x = (torch.randn(m, d, device=DEV) * 2).to(torch.bfloat16)
    w = torch.rand(m, k, device=DEV).softmax(-1)
    idss = [torch.randperm(e, generator=gen, device=DEV)[:m * k].view(m, k).to(torch.int32) for _ in range(args.calls)]
    touched = (2 * i * d // 2 + d * i // 2) * m * k  # bytes of weight codes per call (scales: 1/32 more)
    cfg = pick_moe_config(m * k, e)
    default = dict(bn=cfg.gemv, num_warps=cfg.warps1, unroll=cfg.gemv_unroll, num_stages=cfg.gemv_stages,
                   method="mma" if cfg.gemv_mma else "cuda", split=cfg.gemv_split, split_down=cfg.gemv_split_down)
    if args.default_only:  # fused_moe's launch, blocks of pairs included (the sweeps below: one pair per program)
        default["pairs_per_program"] = cfg.gemv_pairs if pairs_fit(cfg, d, i, m * k) else 1
    t_def = graph_us([lambda ids=ids: moe_gemv(x, ids, w, experts, LIMIT, **default) for ids in idss])
    print(f"tokens {m}: default {default}: {t_def:7.2f} µs  (touched {touched / 1e6:.1f} MB: "
          f"{touched / t_def / 1e3:.0f} GB/s)", flush=True)
    if args.default_only:
        return
    ref = moe_gemv(x, idss[0], w, experts, LIMIT, **default).float()
    if args.mma:
        return _sweep_mma(x, idss, w, experts, ref, t_def, [int(v) for v in args.dot_blocks.split(",")],
                          [int(v) for v in args.stages.split(",")])
    results = []
    shapes = list(itertools.product((32, 64), (2,), (2, 4, 8), (1, 2, 4))) + [(32, 4, 4, 2), (32, 4, 8, 2)]
    for bn, unroll, split, split_down in shapes:  # (64 rows, 4 K blocks per step: spills, ptxas)
        launch = dict(bn=bn, num_warps=4, unroll=unroll, method="cuda", split=split, split_down=split_down)
        try:
            y = moe_gemv(x, idss[0], w, experts, LIMIT, **launch).float()
        except ValueError as err:
            print(f"  {launch}: {err}")
            continue
        err = float((y - ref).norm() / ref.norm())
        t = graph_us([lambda ids=ids: moe_gemv(x, ids, w, experts, LIMIT, **launch) for ids in idss])
        results.append((t, (bn, unroll, split, split_down), err))
        print(f"  cuda bn={bn} unroll={unroll} split={split}/{split_down}: {t:7.2f} µs  rel.diff {err:.1e}",
              flush=True)
    t, best, err = min(r for r in results if r[0] == r[0])
    print(f"best cuda {best}: {t:.2f} µs vs default {t_def:.2f} ({t_def / t:.2f}x), rel.diff {err:.1e}")
    print("best: " + ",".join(str(v) for v in best))


def _sweep_mma(x, idss, w, experts, ref, t_def, dot_blocks: list[int], stages: list[int]) -> None:
    """The tensor-core method's shapes around the default: rows, K blocks per step and per wgmma (`dot_blocks`:
    fewer wgmma waits, more registers), stages, GLU / down split."""
    results = []
    shapes = [(bn, u, 1, st, sp, sd) for bn in (64, 128) for u in (1, 2, 4) for st in stages for sp in (1, 2, 4)
              for sd in (1, 2) if not (bn == 128 and u == 4) and 1 in dot_blocks]
    shapes += [(64, u, kd, st, sp, 1) for u, kd in ((2, 2), (4, 2)) for st in stages for sp in (1, 2, 4)
               if kd in dot_blocks]
    for bn, unroll, kd, stages, split, split_down in shapes:
        launch = dict(bn=bn, num_warps=8 if bn == 128 else 4, unroll=unroll, dot_blocks=kd, num_stages=stages,
                      method="mma", split=split, split_down=split_down)
        try:
            y = moe_gemv(x, idss[0], w, experts, LIMIT, **launch).float()
            t = graph_us([lambda ids=ids: moe_gemv(x, ids, w, experts, LIMIT, **launch) for ids in idss])
        except Exception as err:  # noqa: BLE001 -- a shape the compiler or the launcher refuses
            print(f"  {launch}: {type(err).__name__}: {str(err)[:100]}")
            continue
        err = float((y - ref).norm() / ref.norm())
        results.append((t, (bn, unroll, kd, stages, split, split_down), err))
        print(f"  mma bn={bn} unroll={unroll} dot_blocks={kd} stages={stages} split={split}/{split_down}: "
              f"{t:7.2f} µs  rel.diff {err:.1e}", flush=True)
    t, best, err = min(results)
    print(f"best mma (bn, unroll, dot_blocks, stages, split, split_down) {best}: {t:.2f} µs vs default {t_def:.2f} "
          f"({t_def / t:.2f}x), rel.diff {err:.1e}")


if __name__ == "__main__":
    main()
