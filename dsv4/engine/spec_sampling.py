"""Speculative sampling on the device (`MTPSpeculator`'s device path for sampled rows, `spec_decode.SAMPLED_ON_DEVICE`).

The host path (`spec_decode.rejection_sample`) reads back every draw. Here every draw of a step is made on the device
and the verdict comes back in one read:

  drafts   d ~ q = softmax(filter_logits(MTP logits)) as the exponential race argmax(q / E), E ~ Exp(1);
  verify   at each verified position j of a row, before anyone knows how many drafts are kept: the acceptance test
           of its draft, U * q_j(d) < p_j(d) with U ~ U(0, 1), and a candidate token c_j drawn from the residual
           max(0, p_j - q_j) (from p_j itself at the bonus position, or where the residual is all zero). The row
           keeps its drafts up to the first rejected one, a, and then emits c_a.

Drawing every candidate up front changes nothing in the law: c_a uses noise no acceptance test reads, so given
the tests it is a draw from the residual at a, as in Leviathan et al. (the exponential race needs no
normalisation: argmax(r / E) is a draw from r / sum(r)). Greedy rows (temperature 0) take the argmax of the raw
logits for their drafts and candidates and accept a draft that equals it: `greedy_verify`'s rule.

Noise: unseeded rows share the sampler's generator, one draw for all of them; a seeded row draws from its own
generator, its positions in order, so its stream depends on its own draft count only.
"""
from __future__ import annotations

import torch

from ..model.context import to_device
from .sampler import filter_logits, first_argmax
from .sequence import Sequence


def row_starts(widths: list[int]) -> list[int]:
    """The first position of each row of these widths (rows of consecutive positions)."""
    out, start = [], 0
    for w in widths:
        out.append(start)
        start += w
    return out


def _noise(shape: tuple[int, ...], rows: list[tuple[slice, torch.Generator | None]], device: torch.device,
           default: torch.Generator | None, uniform: bool) -> torch.Tensor:
    """Exp(1) (or U(0, 1), float64) draws of `shape`, rows[i] = (its slice of the first dim, its generator or None
    for the shared one)."""
    out = torch.empty(shape, dtype=torch.float64 if uniform else torch.float32, device=device)
    if any(g is None for _, g in rows):
        (out.uniform_ if uniform else out.exponential_)(generator=default)
    for part, g in rows:
        if g is not None:
            view = out[part]
            (view.uniform_ if uniform else view.exponential_)(generator=g)
    if not uniform:
        out.clamp_min_(torch.finfo(out.dtype).tiny)  # a zero draw would make 0/0 = nan
    return out


def draw_drafts(logits: torch.Tensor, seqs: list[Sequence], generators: list[torch.Generator | None],
                default: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft per row of MTP `logits` [R, V] -> (ids [R] on the device, q [R, V]: the distributions the sampled
    rows drew from, None when every row is greedy)."""
    ids = first_argmax(logits)
    sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if not sampled:
        return ids, None
    q = torch.softmax(filter_logits(logits, [s.params for s in seqs]), dim=-1)
    noise = _noise(tuple(q.shape), [(slice(i, i + 1), generators[i]) for i in sampled], q.device, default, False)
    drawn = first_argmax(q / noise)
    greedy = to_device(torch.tensor([s.params.greedy for s in seqs]), q.device)
    return torch.where(greedy, ids, drawn), q


def verdict(logits: torch.Tensor, seqs: list[Sequence], widths: list[int], drafts: torch.Tensor,
            q: torch.Tensor | None, generators: list[torch.Generator | None], default: torch.Generator | None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every verified position's acceptance test and candidate token, on the device.

    logits [P, V]: the target's logits, row r of `seqs` owning widths[r] consecutive positions (its drafts, then
    the bonus position); drafts [P]: the draft each position verifies (any value at a bonus position); q [P, V]:
    that draft's distribution for sampled rows (any values at bonus positions and greedy rows). Returns (accept [P]
    bool, False at bonus positions; candidate [P] int64). q may be None where no sampled row has a draft."""
    dev, n = logits.device, logits.shape[0]
    bonus = torch.zeros(n, dtype=torch.bool)
    bonus[torch.tensor(widths).cumsum(0) - 1] = True
    bonus = to_device(bonus, dev)
    targets = first_argmax(logits)
    accept = (drafts == targets) & ~bonus
    sampled = [r for r, s in enumerate(seqs) if not s.params.greedy]
    if not sampled:
        return accept, targets
    starts = row_starts(widths) + [n]
    per_pos = [s.params for s, w in zip(seqs, widths) for _ in range(w)]
    p = torch.softmax(filter_logits(logits, per_pos), dim=-1)
    rows = [(slice(starts[r], starts[r + 1]), generators[r]) for r in sampled]
    u = _noise((n,), rows, dev, default, True)
    e = _noise((n, logits.shape[1]), rows, dev, default, False)
    safe = drafts.clamp(0, logits.shape[1] - 1)[:, None]
    q_masked = torch.zeros_like(p) if q is None else q.masked_fill(bonus[:, None], 0.0)  # (no sampled drafts)
    residual = (p - q_masked).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)  # p == q: the rejection had odds ~0
    drawn = first_argmax(residual / e)
    accepted = u * q_masked.gather(1, safe)[:, 0].double() < p.gather(1, safe)[:, 0].double()
    is_sampled = torch.zeros(n, dtype=torch.bool)
    for r in sampled:
        is_sampled[starts[r]: starts[r + 1]] = True
    is_sampled = to_device(is_sampled, dev)
    return (torch.where(is_sampled, accepted & ~bonus, accept), torch.where(is_sampled, drawn, targets))
