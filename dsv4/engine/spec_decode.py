"""MTP speculative decoding: the checkpoint's own `mtp.0` block drafts k tokens, one target forward
verifies them (docs/speculative.md).

Positions. MTP row t combines the target's pre-hc_head residual X_t with the embedding of token t+1,
runs at position t and predicts token t+2. When the target has computed tokens 0..n-1 and token n
(sampled, not yet computed) is known, the MTP state holds rows 0..n-1 -- one position behind the
token stream, level with the target's state. One engine step of a decode row:

  propose  d_1 comes from the MTP logits of row n-1 (computed at the end of the previous step);
           d_i (i >= 2) from a chained MTP row at position n+i-2 fed its own residual and d_{i-1}.
           Chained rows rest on MTP residuals, not the target's, so they are rolled back at once.
  verify   the target computes [x_n, d_1..d_k] at positions n..n+k in one forward; greedy rows
           accept d_i while it equals the target argmax, sampled rows use the rejection rule
           below; the first rejected position emits the target's token (or the bonus token after
           k acceptances). The target state rolls back the rejected drafts (`truncate`).
  advance  after the scheduler appended the tokens: the MTP consumes (X_t, token t+1) for every
           position the target kept this step (prefill chunks too), ending at row n'-1 again, and
           keeps that row's residual and logits for the next step's d_1. With drafts on the device this
           was launched in `verify`, before the verdict, over every position (dsv4.engine.mtp_catch_up).

A batch whose sampled rows are all plain greedy keeps its drafts on the device (argmaxes fed to the
chained rows and the verify forward as they are) and reads the target argmaxes and the drafts back once,
in `verify`; other batches read each draft round back (their draws need the host's generators).

Sampling (Leviathan et al. 2023, Chen et al. 2023): p, q are the *processed* target and draft
distributions (penalties, temperature, min-p, top-k, top-p applied the same way, the output history
extended by the drafts before each position); accept d with probability min(1, p(d)/q(d)), else
draw from norm(max(0, p - q)). The emitted tokens are distributed exactly as non-speculative
sampling from p. Seeded requests draw everything (drafts, acceptance, corrections) from their own
generator, so they are reproducible -- but not token-identical to non-speculative seeded sampling.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, TypeVar

import torch

from ..model.context import ForwardContext, HostCopy, set_forward_context, to_device
from .mtp_catch_up import EarlyCatchUp, MTPCatchUp, Seed
from .outputs import TokenLogprob
from .sampler import apply_penalties, filter_logits, first_argmax, make_generator, penalty_histories, token_logprobs
from .scheduler import ScheduledBatch, ScheduledSeq
from .sequence import Sequence
from .spec_sampling import draw_drafts, row_starts, verdict
from .structured import apply_grammar_masks, grammar_masks

log = logging.getLogger(__name__)

SPECULATIVE_METHODS = ("mtp",)
T = TypeVar("T")

# A batch whose drafts are on the device launches its MTP catch-up before the verdict is read back
# (dsv4.engine.mtp_catch_up): the GPU runs the MTP block and its LM head while the host does the step's bookkeeping.
EARLY_CATCH_UP = True
# Sampled rows (temperature > 0, no penalties, bias, logprobs or grammar) take the device path too
# (dsv4.engine.spec_sampling): their drafts, acceptance tests and corrections drawn on the device, one read-back per
# step. Measured in session 68 (H100, 8 layers, temperature 0.8): a speculative step 1.14x faster at B = 1 and 1.38x
# at B = 8 than the host draws. DSV4_SAMPLED_ON_DEVICE=0 turns it off (GPU test runs: pytest takes no module flags).
SAMPLED_ON_DEVICE = os.environ.get("DSV4_SAMPLED_ON_DEVICE", "1") != "0"


# ---- checkpoint / model checks ---------------------------------------------------------------

def mtp_problem(path: str | Path) -> str | None:
    """Why the checkpoint at `path` has no usable `mtp.0` block (None if it has one). Names only:
    shapes and scales of the block are validated when it is loaded."""
    from ..checkpoint.errors import CheckpointError
    from ..checkpoint.loader import Checkpoint
    from ..config import ModelConfig
    cfg = ModelConfig.from_file(Path(path) / "config.json")
    if not cfg.num_nextn_predict_layers:
        return f"{path}/config.json: num_nextn_predict_layers = 0 (the model has no MTP block)"
    try:
        with Checkpoint.open(path, include_mtp=True, progress=False, check_scales=False) as ckpt:
            if not ckpt.include_mtp:
                return f"{path}: the mtp.* tensors are a drafter variant dsv4 does not support"
    except CheckpointError as e:
        try:  # a backbone problem is not an MTP problem: loading the model reports it
            Checkpoint.open(path, include_mtp=False, progress=False, check_scales=False).close()
        except CheckpointError:
            return None
        return str(e)
    return None


def require_mtp(model) -> None:
    """ValueError unless `model` has a loaded MTP block."""
    mtp = getattr(model, "mtp", None)
    if not mtp or not getattr(mtp[0], "ready", False):
        n = getattr(getattr(model, "config", None), "num_nextn_predict_layers", "?")
        raise ValueError("speculative='mtp' needs the checkpoint's MTP block mtp.0, but this model has none "
                         f"loaded (num_nextn_predict_layers={n}); load the checkpoint with its complete "
                         "mtp.0.* tensors or turn speculation off")


# ---- acceptance rules (pure functions) -------------------------------------------------------

def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from `probs` [V] by the exponential race argmax(p_i / E_i), E_i ~ Exp(1)."""
    noise = torch.empty_like(probs).exponential_(generator=generator).clamp_min_(torch.finfo(probs.dtype).tiny)
    return int((probs / noise).argmax())


def plain_greedy(seq: Sequence) -> bool:
    """Greedy without bias, penalties, logprobs or grammar: its token is the argmax of the raw logits, nothing read
    on the host."""
    p = seq.params
    return (p.greedy and not p.has_logit_bias and not p.has_penalties and p.logprobs is None
            and seq.grammar is None)


def on_device_path(seq: Sequence) -> bool:
    """Whether a sampled row can keep its drafts and verdicts on the device: plain greedy, or (SAMPLED_ON_DEVICE)
    plain sampling -- nothing its draws need from the host (bias, penalties, logprobs, grammar)."""
    p = seq.params
    if p.greedy:
        return plain_greedy(seq)
    return (SAMPLED_ON_DEVICE and not p.has_logit_bias and not p.has_penalties and p.logprobs is None
            and seq.grammar is None)


def greedy_verify(target_ids: list[int], drafts: list[int]) -> list[int]:
    """target_ids[i]: target argmax at draft position i (k + 1 of them). Returns the emitted tokens:
    the accepted drafts, then the target's token at the first mismatch or the bonus token."""
    out = []
    for d, t in zip(drafts, target_ids):
        if d != t:
            return out + [t]
        out.append(d)
    return out + [target_ids[len(drafts)]]


def rejection_sample(p: torch.Tensor, q: torch.Tensor, drafts: list[int],
                     generator: torch.Generator | None) -> list[int]:
    """Speculative sampling. p [k+1, V]: target distributions at the k draft positions and the bonus
    position; q [k, V]: the distributions the drafts were drawn from. Returns the emitted tokens."""
    out = []
    for i, d in enumerate(drafts):
        u = float(torch.rand((), dtype=torch.float64, device=p.device, generator=generator))
        if u * float(q[i, d]) < float(p[i, d]):  # accept with probability min(1, p/q)
            out.append(d)
            continue
        residual = (p[i].double() - q[i].double()).clamp_min(0.0)
        total = float(residual.sum())
        # total == 0 means p == q up to rounding: then the rejection itself had probability ~0
        return out + [draw((residual / total).to(p.dtype) if total > 0 else p[i], generator)]
    return out + [draw(p[len(drafts)], generator)]


# ---- the engine part -------------------------------------------------------------------------

def _rows_tokens(batch: ScheduledBatch, picked: list[int], widths: list[int], emitted) -> list[list[int] | None]:
    """Per batch row: `emitted(i, first position, width)` for the sampled rows `picked`, None for the others."""
    tokens: list[list[int] | None] = [None] * len(batch.rows)
    for i, w, first in zip(picked, widths, row_starts(widths)):
        tokens[i] = emitted(i, first, w)
    return tokens


@dataclass
class SpecStats:
    num_drafts: int = 0            # verified rows that carried at least one draft token
    num_draft_tokens: int = 0      # draft tokens verified
    num_accepted_tokens: int = 0   # of which accepted
    accepted_histogram: list[int] = field(default_factory=list)  # [j]: rows that accepted exactly j

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verified row (accepted drafts + the target's own token)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def record(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        while len(self.accepted_histogram) <= accepted:
            self.accepted_histogram.append(0)
        self.accepted_histogram[accepted] += 1


@dataclass
class _Chain:
    row: ScheduledSeq
    state: object
    residual: torch.Tensor
    logits: torch.Tensor
    chained: int = 0         # chained MTP rows appended to the MTP state (rolled back after drafting)


class MTPSpeculator(MTPCatchUp):
    """Drafting, verification and MTP bookkeeping for `LLMEngine` (propose -> forward -> verify ->
    postprocess -> advance, once per step)."""

    def __init__(self, model, cache, sampler, num_draft_tokens: int):
        require_mtp(model)
        max_rollback = cache.cache_config.max_rollback
        if not isinstance(num_draft_tokens, int) or not 1 <= num_draft_tokens <= max_rollback:
            raise ValueError(f"num_draft_tokens={num_draft_tokens!r}; expected an integer in [1, {max_rollback}] "
                             "(the decode state rolls back at most CacheConfig.max_rollback tokens)")
        self.model, self.cache, self.sampler = model, cache, sampler
        self.num_draft_tokens = num_draft_tokens
        self.stats = SpecStats()
        self._seeds: dict[str, Seed] = {}
        self._q: dict[int, list[torch.Tensor]] = {}  # id(row) -> draft distributions (sampled rows)
        self._early: EarlyCatchUp | None = None
        # decide(fn) -> fn(): the drafts and the verdicts; across TP/EP ranks rank 0 decides and the others
        # receive its result (dsv4.distributed.engine), so every rank runs the same chained rows and rollbacks
        self.decide: Callable[[Callable[[], T]], T] = lambda fn: fn()
        # share(ids) -> ids: the same for ids picked on the device (rank 0's, broadcast in place)
        self.share: Callable[[torch.Tensor], torch.Tensor] = lambda ids: ids
        # batches whose sampled rows are all plain greedy keep their drafts on the device: one read-back per step
        # (the verdict) instead of one per draft and one for the verdict
        self.on_device = True

    # ---- helpers -----------------------------------------------------------------------------
    def _own_generator(self, seq: Sequence, device: torch.device) -> torch.Generator | None:
        """A seeded sampled request's generator for the device draws (None: the sampler's, shared by the unseeded
        rows; greedy rows draw nothing)."""
        return None if seq.params.seed is None or seq.params.greedy else self._generator(seq, device)

    def _generator(self, seq: Sequence, device: torch.device) -> torch.Generator | None:
        if seq.params.seed is None:
            return self.sampler.generator
        if seq.generator is None:
            seq.generator = make_generator(seq.params.seed, device)
        return seq.generator

    @staticmethod
    def _process(logits: torch.Tensor, seqs: list[Sequence], drafted: list[list[int]]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(penalised, processed) logits of rows whose output history is extended by `drafted` (grammars too)."""
        params = [s.params for s in seqs]
        penalised = apply_grammar_masks(apply_penalties(logits, params, *penalty_histories(seqs, drafted)),
                                        grammar_masks(seqs, drafted))
        return penalised, filter_logits(penalised, params)

    def _state(self, seq: Sequence):
        return self.cache.states.get(seq.request_id)

    # ---- 1. drafts ---------------------------------------------------------------------------
    def propose(self, batch: ScheduledBatch) -> None:
        """Fill `row.draft_token_ids` (up to `row.num_draft_tokens`) of the batch's decode rows."""
        self._q.clear()
        chains = []
        for row in batch.rows:
            if not row.num_draft_tokens:
                continue
            seed, state = self._seeds.get(row.seq.request_id), self._state(row.seq)
            if (seed is None or state is None or seed.state is not state or seed.position != row.start - 1
                    or state.mtp.num_tokens != row.start):
                log.debug("request %r: no MTP seed for position %d; decoding without drafts",
                          row.seq.request_id, row.start)
                continue
            chains.append(_Chain(row, state, seed.residual, seed.logits))
        if chains and self.on_device and all(on_device_path(r.seq) for r in batch.rows if r.sample):
            batch.draft_ids = self._draw_on_device(chains)
        else:
            live = chains
            while live:
                for c, d in zip(live, self.decide(lambda: self._draw(live))):
                    c.row.draft_token_ids.append(d)
                live = [c for c in live if len(c.row.draft_token_ids) < c.row.num_draft_tokens]
                if live:
                    dev = live[0].residual.device
                    self._chain(live, to_device(torch.tensor([c.row.draft_token_ids[-1] for c in live]), dev))
        for c in chains:
            if c.chained:
                c.state.mtp.truncate(c.chained)

    def _draw_on_device(self, chains: list[_Chain]) -> torch.Tensor:
        """Every chain's drafts left on the device (argmaxes, or draws: spec_sampling), flat in row order
        (`ScheduledBatch.draft_ids`); the rows' draft_token_ids get placeholders (0) of the right length, and
        sampled rows' draft distributions are kept for `verify`."""
        rounds, members, live = [], [], list(range(len(chains)))  # round j: drafts of the chains live in it
        while live:
            seqs = [chains[i].row.seq for i in live]
            ids, q = draw_drafts(torch.stack([chains[i].logits for i in live]), seqs,
                                 [self._own_generator(s, chains[0].logits.device) for s in seqs],
                                 self.sampler.generator)
            picked = self.share(ids)
            for j, i in enumerate(live):
                if q is not None and not seqs[j].params.greedy:
                    self._q.setdefault(id(chains[i].row), []).append(q[j])
            rounds.append(picked)
            members.append(live)
            for i in live:
                chains[i].row.draft_token_ids.append(0)
            going = [j for j, i in enumerate(live)
                     if len(chains[i].row.draft_token_ids) < chains[i].row.num_draft_tokens]
            live = [live[j] for j in going]
            if live:
                ids = picked if len(going) == len(picked) else picked[to_device(torch.tensor(going), picked.device)]
                self._chain([chains[i] for i in live], ids)
        if len(rounds) == 1:
            return rounds[0]
        flat, where, base = torch.cat(rounds), {}, 0  # where: (chain, round) -> index in flat
        for j, ids in enumerate(members):
            where.update({(i, j): base + n for n, i in enumerate(ids)})
            base += len(ids)
        order = [where[i, j] for i, c in enumerate(chains) for j in range(len(c.row.draft_token_ids))]
        return flat[to_device(torch.tensor(order), flat.device)]

    def _draw(self, live: list[_Chain]) -> list[int]:
        """The next draft of each chain (sampled rows keep their draft distribution q for `verify`)."""
        seqs = [c.row.seq for c in live]
        penalised, processed = self._process(torch.stack([c.logits for c in live]), seqs,
                                             [c.row.draft_token_ids for c in live])
        greedy = first_argmax(penalised).tolist() if any(s.params.greedy for s in seqs) else None
        drafts = []
        for i, c in enumerate(live):
            if c.row.seq.params.greedy:
                drafts.append(greedy[i])  # one read-back for all greedy rows
            else:
                q = torch.softmax(processed[i], dim=-1)
                drafts.append(draw(q, self._generator(c.row.seq, q.device)))
                self._q.setdefault(id(c.row), []).append(q)
        return drafts

    def _chain(self, chains: list[_Chain], ids: torch.Tensor) -> None:
        """One chained MTP row per chain: its residual, its last draft (`ids`, on the device), at the draft's
        position - 1."""
        dev = chains[0].residual.device
        pos = to_device(torch.tensor([c.row.start + len(c.row.draft_token_ids) - 1 for c in chains],
                                     dtype=torch.long), dev)
        # drafts are vocabulary ids and the positions our own bookkeeping: nothing to read back
        with set_forward_context(ForwardContext([1] * len(chains), [c.state for c in chains], trusted_inputs=True)):
            residual, hidden = self.model.forward_mtp(torch.stack([c.residual for c in chains]), ids, pos)
        logits = self.model.compute_logits(hidden)
        for i, c in enumerate(chains):
            c.residual, c.logits, c.chained = residual[i], logits[i], c.chained + 1

    # ---- 2. verification ---------------------------------------------------------------------
    def verify(self, batch: ScheduledBatch, logits: torch.Tensor
               ) -> tuple[list[list[int] | None], list[list[TokenLogprob] | None]]:
        """Accept/reject every sampled row's drafts; roll the target state back over the rejected
        ones. `logits`: `HybridCache.run` output (1 + len(drafts) rows per sampled row). Returns,
        per batch row, the emitted tokens and (if requested) their logprobs; None for other rows."""
        picked = [i for i, r in enumerate(batch.rows) if r.sample]
        widths = [1 + len(batch.rows[i].draft_token_ids) for i in picked]
        if logits.shape[0] != sum(widths):
            raise RuntimeError(f"speculative verify: {logits.shape[0]} logit rows for {sum(widths)} positions")
        if batch.draft_ids is not None:
            tokens, logprobs = self._judge_on_device(batch, logits, picked, widths), [None] * len(batch.rows)
        else:
            tokens, logprobs = self.decide(lambda: self._judge(batch, logits, picked, widths))
        early = self._early if self._early is not None and self._early.batch is batch else None
        caught_up = {id(row) for row, _ in early.rows} if early is not None else set()
        for i in picked:
            drafts, state = batch.rows[i].draft_token_ids, self._state(batch.rows[i].seq)
            accepted = len(tokens[i]) - 1
            if len(drafts) > accepted and state is not None:
                state.truncate(len(drafts) - accepted)
                if id(batch.rows[i]) in caught_up:  # the MTP consumed the rejected positions too: level again
                    state.mtp.truncate(len(drafts) - accepted)
            if drafts:
                self.stats.record(len(drafts), accepted)
        return tokens, logprobs

    def _judge_on_device(self, batch: ScheduledBatch, logits: torch.Tensor, picked: list[int], widths: list[int]
                         ) -> list[list[int] | None]:
        """Verdicts of a batch whose drafts are on the device: every position's acceptance test and candidate
        token (`spec_sampling.verdict`; greedy rows: the target argmax) and the drafts come back in one read, the
        drafts replace the rows' placeholders, then each row keeps its drafts up to the first rejected one and
        emits that position's candidate."""
        dev, n_pos = logits.device, logits.shape[0]
        seqs = [batch.rows[i].seq for i in picked]
        if all(s.params.greedy for s in seqs):  # the argmaxes alone (what session 67 measured)
            targets = self.share(first_argmax(logits))
            read = HostCopy(torch.cat([targets, batch.draft_ids]))
            if EARLY_CATCH_UP:
                self._early = self._catch_up_early(batch, targets)
            host = read.tolist()
            self._place_drafts(batch, host[n_pos:])
            return _rows_tokens(batch, picked, widths, lambda i, first, w: greedy_verify(
                host[first: first + w], batch.rows[i].draft_token_ids))
        firsts = row_starts(widths)
        at = [p for w, first in zip(widths, firsts) for p in range(first, first + w - 1)]  # (the drafts' order)
        drafts = torch.zeros(n_pos, dtype=torch.long, device=dev)
        q = None
        if at:
            at_dev = to_device(torch.tensor(at), dev)
            drafts[at_dev] = batch.draft_ids
            qs = [q_j for i in picked for q_j in self._q.get(id(batch.rows[i]), ())]
            if qs:  # sampled rows' draft distributions, at their positions (bonus positions and greedy rows: 0)
                sampled_at = [p for i, w, first in zip(picked, widths, firsts) if id(batch.rows[i]) in self._q
                              for p in range(first, first + w - 1)]
                q = torch.zeros_like(logits)
                q[to_device(torch.tensor(sampled_at), dev)] = torch.stack(qs)
        accept, candidate = verdict(logits, seqs, widths, drafts, q,
                                    [self._own_generator(s, dev) for s in seqs], self.sampler.generator)
        both = self.share(torch.cat([accept.long(), candidate]))
        read = HostCopy(torch.cat([both, batch.draft_ids]))
        if EARLY_CATCH_UP:  # the token after each position, given its test: its draft if kept, else its candidate
            self._early = self._catch_up_early(batch, torch.where(both[:n_pos] > 0, drafts, both[n_pos:]))
        host = read.tolist()
        self._q.clear()
        accepted, candidates = host[:n_pos], host[n_pos: 2 * n_pos]
        self._place_drafts(batch, host[2 * n_pos:])

        def emitted(i: int, first: int, w: int) -> list[int]:  # the drafts up to the first rejected, its candidate
            kept = next((j for j in range(w - 1) if not accepted[first + j]), w - 1)
            return batch.rows[i].draft_token_ids[:kept] + [candidates[first + kept]]
        return _rows_tokens(batch, picked, widths, emitted)

    @staticmethod
    def _place_drafts(batch: ScheduledBatch, drafted: list[int]) -> None:
        """The drafts read back (flat in row order) in place of the rows' placeholders."""
        for row in batch.rows:
            n = len(row.draft_token_ids)
            row.draft_token_ids, drafted = drafted[:n], drafted[n:]
        batch.draft_ids = None

    def _judge(self, batch: ScheduledBatch, logits: torch.Tensor, picked: list[int], widths: list[int]
               ) -> tuple[list[list[int] | None], list[list[TokenLogprob] | None]]:
        """The emitted tokens (and logprobs) of every sampled row: greedy acceptance or rejection sampling."""
        tokens: list[list[int] | None] = [None] * len(batch.rows)
        logprobs: list[list[TokenLogprob] | None] = [None] * len(batch.rows)
        seqs = [batch.rows[i].seq for i, w in zip(picked, widths) for _ in range(w)]
        drafted = [batch.rows[i].draft_token_ids[:j] for i, w in zip(picked, widths) for j in range(w)]
        penalised, processed = self._process(logits, seqs, drafted)
        greedy = first_argmax(penalised).tolist() if any(s.params.greedy for s in seqs) else None
        start = 0
        for i, w in zip(picked, widths):
            row, rows = batch.rows[i], slice(start, start + w)
            start += w
            seq, drafts = row.seq, row.draft_token_ids
            if seq.params.greedy:
                out = greedy_verify(greedy[rows], drafts)  # one read-back for all greedy rows
            else:
                p = torch.softmax(processed[rows], dim=-1)
                q = torch.stack(self._q[id(row)]) if drafts else p[:0]
                out = rejection_sample(p, q, drafts, self._generator(seq, p.device))
            tokens[i] = out
            if seq.params.logprobs is not None:
                source = logits if self.sampler.logprobs_mode == "raw" else processed
                logprobs[i] = token_logprobs(source[rows][: len(out)], out, seq.params.logprobs)
        self._q.clear()
        return tokens, logprobs
