"""The MTP catch-up of a speculative step (`MTPSpeculator.advance`, docs/speculative.md): the MTP block consumes
(X_t, token t+1) for every position the target kept, and each sequence that decodes next keeps the residual and
logits of its last row, the seed of its next first draft.

Two ways. After the verdict (`_catch_up`): the kept positions only, fed the tokens the scheduler appended. Before it
(`_catch_up_early`, for batches whose drafts are on the device, `spec_decode.EARLY_CATCH_UP`): greedy, the token
after each verified position is the target's argmax there, rejected or not, so the MTP can consume every position
of the forward, fed those argmaxes, while the host waits for the verdict; `verify` rolls the rejected positions back
with the target's, and `_seed_from_early` picks the seeds. The GPU then runs the MTP block and its LM head while the
host does the step's bookkeeping instead of after it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.context import ForwardContext, set_forward_context, to_device
from .scheduler import ScheduledBatch, ScheduledSeq

# the early catch-up's LM head runs over every row that can become a seed (1 + drafts per sampled row) up to this
# many rows; past it, over the seeds alone once the verdict is known
EARLY_HEAD_MAX_ROWS = 128


@dataclass
class Seed:
    """What the next step's first draft starts from: MTP row `position` (= n - 1) of `state`."""
    state: object
    position: int
    residual: torch.Tensor   # [hc*D] MTP residual of that row (chained drafts feed it back)
    logits: torch.Tensor     # [V] MTP logits of that row: the draft distribution of token n + 1


@dataclass
class EarlyCatchUp:
    """The MTP catch-up of `batch` launched before its verdict: every row's positions (`rows`: the row and its first
    position in the MTP forward), the seed candidates' positions `heads` and, unless there were too many, their
    logits."""
    batch: ScheduledBatch
    rows: list[tuple[ScheduledSeq, int]]
    residual: torch.Tensor
    hidden: torch.Tensor
    heads: list[int]
    logits: torch.Tensor | None


class MTPCatchUp:
    """`MTPSpeculator`'s third part; uses its `model`, `cache`, `_state`, `_seeds` and `_early`."""

    # ---- 3. MTP catch-up ---------------------------------------------------------------------
    def advance(self, batch: ScheduledBatch) -> None:
        """After `Scheduler.postprocess`: feed the MTP every position the target kept in this step and
        keep the seed of each sequence that decodes next."""
        early, self._early = self._early, None
        if early is not None and early.batch is batch:
            self._seed_from_early(early)
        else:
            self._catch_up(batch)
        # forget sequences whose state the cache released (finished, aborted, preempted)
        self._seeds = {rid: s for rid, s in self._seeds.items() if self.cache.states.get(rid) is s.state}

    def _catch_up_early(self, batch: ScheduledBatch, targets: torch.Tensor) -> EarlyCatchUp | None:
        """Launch the MTP over every position of the batch's forward, before the verdict (EARLY_CATCH_UP): the
        sequences' own next tokens where known, the target argmaxes `targets` (flat over the sampled rows' logit
        rows) after the sampled rows' positions."""
        residual = self.model.get_mtp_target_hidden_states()
        parts, ids, pos, lens, states, rows, heads, take = [], [], [], [], [], [], [], []
        offset = flat = first_target = 0
        for row in batch.rows:
            width, seq, state = len(row.token_ids), row.seq, self._state(row.seq)
            picks = 1 + len(row.draft_token_ids) if row.sample else 0  # its logit rows: the last `picks` positions
            if not seq.is_finished and state is not None:
                if state.mtp.num_tokens != row.start:
                    raise RuntimeError(f"request {seq.request_id!r}: MTP state at {state.mtp.num_tokens}, "
                                       f"row starts at {row.start}")
                known = width - picks
                parts.append(residual[offset: offset + width])
                ids.extend(seq.token_ids[row.start + 1: row.start + known + 1] + [0] * picks)
                heads.extend(range(flat + known, flat + width))
                take.extend(range(first_target, first_target + picks))
                pos.extend(range(row.start, row.start + width))
                lens.append(width)
                states.append(state)
                rows.append((row, flat))
                flat += width
            offset += width
            first_target += picks
        if not lens:
            return None
        dev = residual.device
        ids_dev = to_device(torch.tensor(ids, dtype=torch.long), dev)
        heads_dev = to_device(torch.tensor(heads, dtype=torch.long), dev)
        if heads:
            picked = targets if take == list(range(targets.shape[0])) else targets[to_device(torch.tensor(take), dev)]
            ids_dev[heads_dev] = picked
        res, hidden = self._forward(parts, ids_dev, pos, lens, states)
        logits = None
        if heads and len(heads) <= EARLY_HEAD_MAX_ROWS:
            logits = self.model.compute_logits(hidden[heads_dev])
        return EarlyCatchUp(batch, rows, res, hidden, heads, logits)

    def _forward(self, parts: list[torch.Tensor], ids: torch.Tensor, pos: list[int], lens: list[int], states: list
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP block over the sequences' rows (residual `parts`, next-token `ids` on the device, positions):
        (its residual, hidden). The ids are the sequences' own tokens (checked on arrival), sampled ids or argmaxes,
        the positions our bookkeeping: nothing to read back."""
        with set_forward_context(ForwardContext(lens, states, trusted_inputs=True)):
            return self.model.forward_mtp(parts[0] if len(parts) == 1 else torch.cat(parts), ids,
                                          to_device(torch.tensor(pos, dtype=torch.long), ids.device))

    def _seed_from_early(self, early: EarlyCatchUp) -> None:
        """The seeds of an early catch-up, once the scheduler has appended the verdict's tokens (`verify` rolled
        the MTP back with the target)."""
        ready = []
        for row, first in early.rows:
            seq, state = row.seq, self._state(row.seq)
            if seq.is_finished or state is None:
                continue
            kept = seq.num_computed_tokens - row.start
            if state.mtp.num_tokens != row.start + kept or not 0 < kept <= len(row.token_ids):
                raise RuntimeError(f"request {seq.request_id!r}: MTP state at {state.mtp.num_tokens}, "
                                   f"row starts at {row.start}, {kept} tokens kept")
            if row.sample:
                ready.append((seq.request_id, state, first + kept - 1, row.start + kept - 1))
        if not ready:
            return
        dev = early.hidden.device
        if early.logits is not None:
            at = {f: i for i, f in enumerate(early.heads)}
            logits = early.logits[to_device(torch.tensor([at[r[2]] for r in ready]), dev)]
        else:
            logits = self.model.compute_logits(early.hidden[to_device(torch.tensor([r[2] for r in ready]), dev)])
        self._keep_seeds(ready, early.residual, logits)

    def _catch_up(self, batch: ScheduledBatch) -> None:
        """The MTP over the positions the target kept, after the verdict (batches without early catch-up)."""
        residual = self.model.get_mtp_target_hidden_states()
        parts, ids, pos, lens, states, ready = [], [], [], [], [], []
        offset = flat = 0
        for row in batch.rows:
            width = len(row.token_ids)
            seq, state = row.seq, self._state(row.seq)
            if not seq.is_finished and state is not None:
                kept = seq.num_computed_tokens - row.start
                if state.mtp.num_tokens != row.start or not 0 < kept <= width:
                    raise RuntimeError(f"request {seq.request_id!r}: MTP state at {state.mtp.num_tokens}, "
                                       f"row starts at {row.start}, {kept} tokens kept")
                parts.append(residual[offset: offset + kept])
                ids.extend(seq.token_ids[row.start + 1: row.start + kept + 1])
                pos.extend(range(row.start, row.start + kept))
                lens.append(kept)
                states.append(state)
                flat += kept
                if row.sample:
                    ready.append((seq.request_id, state, flat - 1, row.start + kept - 1))
            offset += width
        if offset != residual.shape[0]:
            raise RuntimeError(f"speculative advance: the last forward had {residual.shape[0]} tokens, "
                               f"the batch {offset}")
        if lens:
            dev = residual.device
            res, hidden = self._forward(parts, to_device(torch.tensor(ids, dtype=torch.long), dev), pos, lens, states)
            if ready:
                last = to_device(torch.tensor([r[2] for r in ready], dtype=torch.long), dev)
                self._keep_seeds(ready, res, self.model.compute_logits(hidden[last]))

    def _keep_seeds(self, ready: list[tuple], residual: torch.Tensor, logits: torch.Tensor) -> None:
        """Seeds of the `ready` rows (request id, state, row of the MTP forward, position); logits: theirs, in order."""
        for j, (rid, state, at, position) in enumerate(ready):
            self._seeds[rid] = Seed(state, position, residual[at].clone(), logits[j])
