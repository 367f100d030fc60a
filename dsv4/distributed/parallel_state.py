"""Process groups of a multi-process run: tensor parallel (TP) and expert parallel (EP) over W ranks.

W = max(tp, ep) processes, each of which sees the same tokens (hidden states are replicated after
every sub-layer). Rank r belongs to

    TP group  ranks [r - r % tp, r - r % tp + tp), tp_rank = r % tp:  attention heads and output
              groups, the shared expert's intermediate dim, the vocabulary (embed, head);
    EP group  ranks [r - r % ep, r - r % ep + ep), ep_rank = r % ep:  routed experts, E / ep each.

`--tp 2 --ep 2` therefore runs on two processes: attention split in two by heads, experts split in two
by expert (vLLM's TP + expert-parallel layout). With tp < W the W/tp TP groups compute the same
attention; with ep < W the W/ep EP groups hold the same experts.

Reductions go through `all_reduce` in the tensor's dtype: callers hand in partial sums in the
accumulation dtype (float64 for a float32 model), so a sharded float32 model rounds exactly where the
single-process one does. A separate gloo "control" group with a long timeout carries the engine's
python objects (requests, sampled ids): it may sit idle while a server waits for traffic.
"""
from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

MOE_COMM = ("allreduce", "alltoall")
CONTROL_TIMEOUT = datetime.timedelta(days=30)


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    ep: int = 1
    moe_comm: str = "allreduce"  # how routed-expert outputs are combined (dsv4.distributed.moe_comm)

    def __post_init__(self) -> None:
        for name in ("tp", "ep"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name} must be an integer >= 1, got {v!r}")
        if self.world_size % self.tp or self.world_size % self.ep:
            raise ValueError(f"--tp {self.tp} and --ep {self.ep}: the smaller must divide the larger "
                             f"(the run uses max(tp, ep) = {self.world_size} processes)")
        if self.moe_comm not in MOE_COMM:
            raise ValueError(f"moe_comm={self.moe_comm!r}; allowed: {', '.join(MOE_COMM)}")

    @property
    def world_size(self) -> int:
        return max(self.tp, self.ep)


class ParallelState:
    """This rank's place in the layout and its process groups. Build with `init_parallel`."""

    def __init__(self, config: ParallelConfig, rank: int, device: torch.device,
                 tp_group, ep_group, control_group):
        self.config = config
        self.rank, self.world_size = rank, config.world_size
        self.tp, self.ep = config.tp, config.ep
        self.tp_rank, self.ep_rank = rank % config.tp, rank % config.ep
        self.tp_group, self.ep_group, self.control_group = tp_group, ep_group, control_group
        self.device = device
        self.moe_comm = config.moe_comm  # may be switched at run time (benchmarks)
        # small CUDA reductions over two-rank groups (dsv4.distributed.fast_allreduce); None: NCCL only
        self.tp_fast = self.ep_fast = None

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def same_groups(self) -> bool:
        """TP and EP groups are the same ranks (tp == ep): one all-reduce can serve both."""
        return self.tp == self.ep

    def reduce_tp(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce(t, self.tp_group, self.tp, self.tp_fast)

    def reduce_ep(self, t: torch.Tensor) -> torch.Tensor:
        return all_reduce(t, self.ep_group, self.ep, self.ep_fast)

    def gather_tp(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return all_gather_cat(t, self.tp_group, self.tp, dim)

    def gather_ep(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return all_gather_cat(t, self.ep_group, self.ep, dim)

    def __repr__(self) -> str:
        return (f"ParallelState(rank {self.rank}/{self.world_size}, tp {self.tp_rank}/{self.tp}, "
                f"ep {self.ep_rank}/{self.ep}, moe_comm={self.moe_comm}, device={self.device})")


# ---- collectives (no-ops on groups of one) -------------------------------------------------------

def all_reduce(t: torch.Tensor, group, size: int, fast=None) -> torch.Tensor:
    """In-place sum over `group` in t's dtype; returns t. `fast`: the group's FastAllReduce, used for the
    tensors it handles (the same bits as NCCL's sum over two ranks)."""
    if size > 1:
        if fast is not None and fast.handles(t):
            return fast(t)
        dist.all_reduce(t, group=group)
    return t


def all_gather_cat(t: torch.Tensor, group, size: int, dim: int) -> torch.Tensor:
    """Concatenate equal-shaped pieces of all ranks of `group` (in rank order) along `dim`."""
    if size == 1:
        return t
    t = t.contiguous()
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t, group=group)
    return torch.cat(parts, dim=dim)


def broadcast_object(obj, ps: ParallelState):
    """Rank 0's `obj` on every rank (pickled, over the control group)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=ps.control_group)
    return box[0]


# ---- setup ---------------------------------------------------------------------------------------

def _block_groups(size: int, world: int, rank: int, **kw):
    """Create the groups [0, size), [size, 2 size), ... (every rank must create all of them, in order)
    and return the one holding `rank`."""
    mine = None
    for start in range(0, world, size):
        ranks = list(range(start, start + size))
        g = dist.new_group(ranks, **kw)
        if rank in ranks:
            mine = g
    return mine


_state: ParallelState | None = None


def init_parallel(config: ParallelConfig, device: torch.device | str | None = None) -> ParallelState:
    """Create this rank's groups (torch.distributed must be initialised with world size
    max(tp, ep)). Every rank must call it, with the same config. Device default: cuda:LOCAL_RANK when
    CUDA is available, else cpu."""
    global _state
    if not dist.is_initialized():
        raise ValueError("init_parallel: torch.distributed is not initialised (use dsv4.distributed.launcher)")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != config.world_size:
        raise ValueError(f"--tp {config.tp} --ep {config.ep} needs {config.world_size} processes, "
                         f"this run has {world}")
    if device is None:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    tp_group = _block_groups(config.tp, world, rank)
    ep_group = tp_group if config.tp == config.ep else _block_groups(config.ep, world, rank)
    control = dist.new_group(list(range(world)), backend="gloo", timeout=CONTROL_TIMEOUT)
    _state = ParallelState(config, rank, device, tp_group, ep_group, control)
    from dsv4.distributed.fast_allreduce import build_fast_allreduce
    _state.tp_fast = build_fast_allreduce(tp_group, config.tp, device)
    _state.ep_fast = _state.tp_fast if ep_group is tp_group else build_fast_allreduce(ep_group, config.ep, device)
    log.info("%s", _state)
    return _state


def get_parallel_state() -> ParallelState | None:
    """The state made by the last `init_parallel` of this process (None in a single-process run)."""
    return _state


def destroy_parallel() -> None:
    """Forget the state and tear down torch.distributed (if this process initialised it)."""
    global _state
    _state = None
    if dist.is_initialized():
        dist.destroy_process_group()
