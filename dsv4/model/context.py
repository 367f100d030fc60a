"""Forward context: how a flat batch of tokens splits into sequences, and each sequence's state.

The model's `forward(input_ids, positions)` takes a flat batch (several sequences packed one after
another). The sequence boundaries and the per-sequence decode state travel beside it, set by the
caller for the duration of one forward:

    ctx = ForwardContext(seq_lens=[5, 1, 1], states=[s0, s1, s2])
    with set_forward_context(ctx):
        hidden = model(input_ids, positions)

Sequence i owns tokens [sum(seq_lens[:i]), sum(seq_lens[:i+1])); its positions must continue its
state (`states[i].num_tokens, ...`). A forward appends the tokens to the states. Without a context the
tokens form one fresh sequence starting at position 0 (its state is discarded afterwards).

Checking ids and positions is free for host tensors but reads device tensors back (a wait for the
GPU queue). A caller whose ids and positions are right by construction (the engine: prompts checked
on arrival, sampled ids, positions from its own bookkeeping) sets `trusted_inputs=True`; then device
ids and positions are not read back (host ones are still checked: that costs nothing).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from dsv4.model.rope import check_positions

from dsv4.model.state import LayerState, SequenceState


@dataclass
class ForwardContext:
    seq_lens: list[int]
    states: list[SequenceState]
    trusted_inputs: bool = False  # ids in range and positions continuing the states, by construction
    # a mixed step in one forward (dsv4.model.mixed_steps): the first `decode_head` sequences bring decode rows,
    # which attend as one fixed-shape paged step; the rest bring prompt chunks
    decode_head: int = 0

    def __post_init__(self) -> None:
        if len(self.seq_lens) != len(self.states):
            raise ValueError(f"ForwardContext: {len(self.seq_lens)} seq_lens but {len(self.states)} states")
        if any(int(n) < 0 for n in self.seq_lens):
            raise ValueError(f"ForwardContext: negative entry in seq_lens={self.seq_lens}")
        if not 0 <= self.decode_head <= len(self.states):
            raise ValueError(f"ForwardContext: decode_head={self.decode_head} for {len(self.states)} sequences")
        if len({id(s) for s in self.states}) != len(self.states):
            raise ValueError("ForwardContext: the same SequenceState appears twice in one batch")


_current: ForwardContext | None = None


@contextlib.contextmanager
def set_forward_context(ctx: ForwardContext | None) -> Iterator[ForwardContext | None]:
    """Make `ctx` the forward context inside the `with` block (nesting restores the outer one)."""
    global _current
    previous, _current = _current, ctx
    try:
        yield ctx
    finally:
        _current = previous


def get_forward_context() -> ForwardContext | None:
    return _current


@dataclass
class Segment:
    """Tokens [start, start + length) of the flat batch: one sequence, with its state of one layer."""
    start: int
    length: int
    state: LayerState


def check_token_ids(ids: torch.Tensor, vocab: int, what: str, trusted: bool = False) -> None:
    """ValueError unless every id lies in [0, vocab). Host ids are checked on the host; device ids
    with one read-back, or not at all when `trusted` (see the module docstring)."""
    if ids.numel() == 0 or (trusted and ids.device.type != "cpu"):
        return
    lo, hi = torch.stack(torch.aminmax(ids)).tolist()  # one transfer for both ends
    if lo < 0 or hi >= vocab:
        raise ValueError(f"{what} out of range [0, {vocab}): found {lo if lo < 0 else hi}")


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`; host -> GPU through pinned memory without waiting (the caching host allocator
    keeps the pinned block until the copy has run, so the source may be dropped at once)."""
    if t.device.type == "cpu" and torch.device(device).type == "cuda":
        # a fresh pinned block + copy: `t.pin_memory()` first asks the driver whether t is pinned
        # (measured 0.22 ms of host time per call on the H200 host)
        staged = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        staged.copy_(t)
        return staged.to(device, non_blocking=True)
    return t.to(device)


class HostCopy:
    """`t`'s copy to the host, queued at once (pinned memory, an event): `tolist()` later waits for this copy only,
    not for work launched on the stream after it."""

    def __init__(self, t: torch.Tensor):
        self._host, self._copied = t, None
        if t.device.type == "cuda":
            self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self._host.copy_(t, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    def tolist(self) -> list:
        if self._copied is not None:
            self._copied.synchronize()
        return self._host.tolist()


def sequence_spans(ctx: ForwardContext, positions: torch.Tensor, lengths: list[int]) -> list[tuple[int, int]]:
    """Validate a flat batch against the context: (start, length) per sequence, in batch order.

    `lengths[i]` is the number of tokens sequence i has already processed; its positions in this
    batch must be `lengths[i], lengths[i] + 1, ...`. The largest position is checked from the host-side
    lengths; the positions themselves unless they are on a device and `ctx.trusted_inputs`."""
    seq_lens = [int(n) for n in ctx.seq_lens]
    total = sum(seq_lens)
    if total != positions.shape[0]:
        raise ValueError(f"ForwardContext.seq_lens sums to {total} but the batch has {positions.shape[0]} tokens")
    spans, start = [], 0
    for n in seq_lens:
        spans.append((start, n))
        start += n
    ends = [done + n for n, done in zip(seq_lens, lengths) if n]
    if ends:
        check_positions(max(ends) - 1)
    if not total or (ctx.trusted_inputs and positions.device.type != "cpu"):
        return spans
    # expected[k] = lengths[i] + (k - start_i) for token k of sequence i: a few ops whatever the batch
    shift = torch.tensor([done - s for (s, _), done in zip(spans, lengths)], dtype=torch.long)
    expected = torch.arange(total) + shift.repeat_interleave(torch.tensor(seq_lens), output_size=total)
    if not torch.equal(positions.cpu().long(), expected):  # one transfer for the whole batch
        for i, ((start, n), done) in enumerate(zip(spans, lengths)):
            got = positions[start:start + n].tolist()
            if got != list(range(done, done + n)):
                raise ValueError(f"sequence {i}: positions {got[:8]}... must continue its state, i.e. run "
                                 f"{done}..{done + n - 1}")
    return spans


def engine_pools(ctx: ForwardContext):
    """The engine's pools when every sequence of the batch is paged in the same ones, else None."""
    pools = getattr(ctx.states[0].layers[0], "pools", None) if ctx.states else None
    if pools is None or any(getattr(s.layers[0], "pools", None) is not pools for s in ctx.states):
        return None
    return pools


def paged_step_pools(ctx: ForwardContext):
    """The engine's pools when every sequence of the batch is paged there and brings 1 to
    `max_rollback + 1` tokens (decode, MTP draft/verify, short prompt tails): such a batch runs as
    one fixed-shape step (dsv4.engine.paged_decode)."""
    pools = engine_pools(ctx)
    if pools is None or not all(1 <= int(n) <= pools.max_rollback + 1 for n in ctx.seq_lens):
        return None
    return pools


def advance_paged(states: list[SequenceState], lens: list[int], mtp: bool = False) -> None:
    """Host bookkeeping after a fixed-shape step (which wrote the states on the device): the
    backbone layers, or the MTP block's state, move on by lens[b] tokens."""
    for s, n in zip(states, lens):
        n = int(n)
        for layer in ([s.mtp] if mtp else s.layers):
            layer.advance_decode(n)

