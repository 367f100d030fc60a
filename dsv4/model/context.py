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

    def __post_init__(self) -> None:
        if len(self.seq_lens) != len(self.states):
            raise ValueError(f"ForwardContext: {len(self.seq_lens)} seq_lens but {len(self.states)} states")
        if any(int(n) < 0 for n in self.seq_lens):
            raise ValueError(f"ForwardContext: negative entry in seq_lens={self.seq_lens}")
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


def sequence_spans(ctx: ForwardContext, positions: torch.Tensor, lengths: list[int]) -> list[tuple[int, int]]:
    """Validate a flat batch against the context: (start, length) per sequence, in batch order.

    `lengths[i]` is the number of tokens sequence i has already processed; its positions in this
    batch must be `lengths[i], lengths[i] + 1, ...`."""
    total = sum(int(n) for n in ctx.seq_lens)
    if total != positions.shape[0]:
        raise ValueError(f"ForwardContext.seq_lens sums to {total} but the batch has {positions.shape[0]} tokens")
    spans, start, expected = [], 0, []
    for n, done in zip(ctx.seq_lens, lengths):
        n = int(n)
        expected.append(torch.arange(done, done + n))
        spans.append((start, n))
        start += n
    expected = torch.cat(expected) if expected else torch.empty(0, dtype=torch.long)
    if expected.numel():
        check_positions(int(expected.max()))
    if not torch.equal(positions.cpu().long(), expected):  # one transfer for the whole batch
        for i, ((start, n), done) in enumerate(zip(spans, lengths)):
            got = positions[start:start + n].tolist()
            if got != list(range(done, done + n)):
                raise ValueError(f"sequence {i}: positions {got[:8]}... must continue its state, i.e. run "
                                 f"{done}..{done + n - 1}")
    return spans


def paged_step_pools(ctx: ForwardContext):
    """The engine's pools when every sequence of the batch is paged there and brings 1 to
    `max_rollback + 1` tokens (decode, MTP draft/verify, short prompt tails): such a batch runs as
    one fixed-shape step (dsv4.engine.paged_decode)."""
    if not ctx.states:
        return None
    pools = getattr(ctx.states[0].layers[0], "pools", None)
    if pools is None or any(getattr(s.layers[0], "pools", None) is not pools for s in ctx.states):
        return None
    if not all(1 <= int(n) <= pools.max_rollback + 1 for n in ctx.seq_lens):
        return None
    return pools


def advance_paged(states: list[SequenceState], lens: list[int], mtp: bool = False) -> None:
    """Host bookkeeping after a fixed-shape step (which wrote the states on the device): the
    backbone layers, or the MTP block's state, move on by lens[b] tokens."""
    for s, n in zip(states, lens):
        for layer in ([s.mtp] if mtp else s.layers):
            layer.advance_decode(int(n))

