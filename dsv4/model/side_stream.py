"""Side CUDA streams for independent branches of a layer: the shared expert runs beside the router and the
routed experts, the compressor / indexer projections beside the query path, and (a CSA layer's paged decode step,
attention.INDEXER_BESIDE) the indexer's chain -- its wq_b, queries, scores, top-k -- beside the attention's wq_b
on a stream of its own, and (block.STEP_TABLES_BESIDE) the later layers' step tables beside the first layer. Under
CUDA-graph capture the fork and join become a parallel branch of the graph.

Why: at decode sizes neither branch fills the GPU (the routed MoE's programs are ~1.5 waves, the shared
expert's GEMMs stream 24 MB with a few programs per SM; the projections are one small launch beside a
chain of small launches), so running them side by side overlaps their latency tails (graph replay of 8
Flash layers at B = 1: 1.82 -> 1.77 ms, s12b). The results are the same bits: the same kernels on the
same inputs, only their order in time changes. Above MAX_ROWS tokens (prefill) the branches run inline:
there the kernels fill the GPU on their own (8K prefill 136 vs 137 ms with the side stream, s12a).

Discipline that keeps the caching allocator safe without events per tensor: the branch only reads
tensors the caller keeps alive until `join()`; the side stream first waits for all work queued on the
current stream; the branch's outputs are marked as used by the current stream at the join. A branch must
not free or replace a tensor the main stream allocated (the allocator would hand its memory to the main
stream's next allocation while the branch still reads it) unless it marks it with `record_stream` first:
session 46 found the attention's projection stack built that way on first use (`fused_input_weight`).
"""

from __future__ import annotations

from typing import Callable, TypeVar

import torch

# The branches that run beside (A/B runs in bench/, debugging): any other name runs inline.
OVERLAP = ("shared_expert", "projections", "indexer", "step_tables")
# Each branch's lane: its side stream and its kernels' arrival counters (`_triton.counter_lane`). Branches that may
# run at the same time need lanes of their own: a CSA layer's indexer chain runs beside its projections' branch.
LANES = {"shared_expert": 1, "projections": 1, "indexer": 2, "step_tables": 3}
# Stream priority per lane (CUDA: lower is higher; absent or 0 the default, -1 high): where the main stream streams
# a big weight beside a branch of small latency-bound launches (wq_b beside the indexer's chain), a high-priority
# branch gets SM slots as the main kernel's programs retire instead of queueing behind them (the s52 timeline: that
# chain's launches ran 2-3x their time alone). The indexer and step-table lanes high since s54 (measured together
# with attention.INDEXER_BESIDE). To raise the projections' branch alone, give it a lane of its own first.
PRIORITY: dict[int, int] = {2: -1, 3: -1}
MAX_ROWS = 128  # the largest CUDA-graph decode bucket

T = TypeVar("T")
_SIDE: dict[tuple, torch.cuda.Stream] = {}


def _side(device: torch.device, lane: int) -> torch.cuda.Stream:
    key = (device.index if device.index is not None else torch.cuda.current_device(), lane, PRIORITY.get(lane, 0))
    if key not in _SIDE:
        _SIDE[key] = torch.cuda.Stream(device=key[0], priority=key[2])
    return _SIDE[key]


def start_beside(device: torch.device, name: str, rows: int, fn: Callable[..., T], *args) -> Callable[[], T]:
    """Queue branch `name` = fn(*args) over `rows` tokens on its lane's side stream after the work queued
    so far on the current stream; returns join(), which makes the stream current at its call (the main stream,
    or another branch's) wait for the branch and gives fn's result. Off CUDA, above MAX_ROWS, or for a name not
    in OVERLAP, fn runs now and join() just returns its result. The branch's kernels use their lane's arrival
    counters (`_triton.counter_lane`)."""
    if not (name in OVERLAP and device.type == "cuda" and rows <= MAX_ROWS):
        out = fn(*args)
        return lambda: out
    from dsv4.kernels import _triton
    side = _side(device, LANES[name])
    side.wait_stream(torch.cuda.current_stream(device))
    lane, _triton.counter_lane = _triton.counter_lane, LANES[name]
    try:
        with torch.cuda.stream(side):
            out = fn(*args)
    finally:
        _triton.counter_lane = lane

    def join() -> T:
        waiting = torch.cuda.current_stream(device)
        waiting.wait_stream(side)
        _record(out, waiting)
        return out

    return join


def _record(out, stream: torch.cuda.Stream) -> None:
    """Mark every tensor in out (nested tuples / lists / dict values) as used by stream."""
    if isinstance(out, torch.Tensor):
        out.record_stream(stream)
    elif isinstance(out, (tuple, list, dict)):
        for t in (out.values() if isinstance(out, dict) else out):
            _record(t, stream)
