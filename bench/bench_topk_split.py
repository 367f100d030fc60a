"""The indexer's top-k on a few long rows (decode at long contexts): one program per row against rows split
into slices (`dsv4.kernels.topk.SPLIT_*`), µs per call in a CUDA graph, same picks checked.

    python bench/bench_topk_split.py [--rows 1,8,64] [--n 1024,...,262144] [--k 512] [--slice 1024]

Scores look like the decode indexer's: relu'd weighted sums (spread magnitudes, exact zeros, bf16 ties), the row's
last entries -inf (absent). A development aid for issue #6 (long-context decode), not a model benchmark. (Session
70's table in docs/benchmarks.md timed median replays with a warm L2; `timed` flushes L2 before each replay.)
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))


def _scores(rows: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.relu(torch.randn(rows, n, generator=gen, device="cuda"))
    s = s * torch.exp2(torch.randint(-4, 5, (rows, n), generator=gen, device="cuda").float())
    present = torch.arange(n, device="cuda")[None, :] < (n - 100)
    return s.to(torch.bfloat16).masked_fill(~present, float("-inf")), present.expand(rows, n).contiguous()


def _graph_us(call, reps: int = 20) -> float:
    """µs per call: `reps` calls captured in one graph (its launch cost spread over them), `bench_gemm_moe.timed`."""
    from bench_gemm_moe import timed
    us, how = timed(lambda: [call() for _ in range(reps)])
    assert how == "graph", "the top-k launches must be capturable"
    return us / reps


def main() -> None:
    from dsv4.kernels import topk

    p = argparse.ArgumentParser()
    p.add_argument("--rows", default="1,8,64")
    p.add_argument("--n", default="1024,2048,4096,8192,16384,65536,262144")
    p.add_argument("--k", type=int, default=512)
    p.add_argument("--slice", type=int, default=topk.SPLIT_SLICE)
    args = p.parse_args()
    print(f"{torch.cuda.get_device_name()}; k = {args.k}, slices of {args.slice} (up to {topk.SPLIT_MAX_SLICES})")
    print(f"{'rows':>5} {'N':>7} {'slices':>6} {'one program us':>15} {'split us':>9} {'one / split':>11} same")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for rows in map(int, args.rows.split(",")):
        for n in map(int, args.n.split(",")):
            scores, present = _scores(rows, n, gen)
            k = min(args.k, n)
            out = {}
            for name, min_n, slice_len in (("one", 1 << 40, topk.SPLIT_SLICE), ("split", 0, args.slice)):
                topk.SPLIT_MIN_N, topk.SPLIT_MAX_ROWS, topk.SPLIT_SLICE = min_n, 1 << 20, slice_len
                res = topk.topk_lowest_index(scores, k, present, mark_absent=True)
                out[name] = (_graph_us(lambda: topk.topk_lowest_index(scores, k, present, mark_absent=True)), res)
            slices = topk.split_slices(rows, n, scores.dtype)
            same = all(torch.equal(a, b) for a, b in zip(out["one"][1], out["split"][1]))
            print(f"{rows:5d} {n:7d} {slices:6d} {out['one'][0]:15.1f} {out['split'][0]:9.1f} "
                  f"{out['one'][0] / out['split'][0]:11.2f} {same}")


if __name__ == "__main__":
    main()
