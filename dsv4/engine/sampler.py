"""Batched token sampler: penalties, temperature, min-p / top-k / top-p, seeded sampling, logprobs.

Order of operations per row (vLLM's order):
  0. logit_bias: each listed token's bias added to the model's logit (OpenAI semantics);
  1. penalties on the biased logits: repetition (prompt + output tokens; positive logits divided,
     negative multiplied), then frequency and presence (output tokens only, OpenAI semantics);
     then a structured output's grammar: tokens it does not allow next get -inf (dsv4.engine.structured);
  2. greedy rows (temperature 0): argmax of the penalised logits, ties -> lowest token id;
  3. other rows: divide by temperature; min-p (keep p >= min_p * p_max), top-k (the k most likely,
     ties -> lower ids first), top-p (the smallest most-likely prefix whose renormalised mass
     reaches top_p, computed over the min-p / top-k survivors); filtered logits become -inf;
  4. draw with the exponential race: token = argmax(p_i / E_i), E_i ~ Exp(1) i.i.d., which picks
     i with probability p_i. A seeded row draws its E from its own torch.Generator, always V
     numbers per step, so its tokens do not depend on the rest of the batch.

Logprobs: mode "raw" (default, vLLM's default) reports log_softmax of the model's logits before
any processing (logit_bias included); mode "processed" reports log_softmax of the logits actually sampled
from (after bias, penalties, temperature and filters; filtered tokens get -inf; greedy rows: penalised
logits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import torch

from dsv4.engine.outputs import TokenLogprob
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine.structured import apply_grammar_masks, grammar_masks
from dsv4.model.context import to_device

LOGPROBS_MODES = ("raw", "processed")


@dataclass
class TokenLogprobs:
    logprob: float                  # logprob of the sampled token
    rank: int                       # 1 + number of tokens with a strictly larger logprob
    top: list[tuple[int, float]]    # the n best (token id, logprob), descending, ties -> lower id


@dataclass
class SamplerOutput:
    token_ids: list[int]                       # one per row
    logprobs: list[TokenLogprobs | None]       # one per row; None where params.logprobs is None


def _on(values: list, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A small host list as a tensor on `device`, copied without waiting for the GPU queue (a plain
    `torch.tensor(values, device=cuda)` waits until every queued kernel has run)."""
    return to_device(torch.tensor(values, dtype=dtype), device)


ARGMAX_PIECES = 128  # pieces per row of `first_argmax`'s first pass


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(-1)`: the first maximum of each row (NaN counts as the largest, as in torch), in two passes.
    torch's reduce gives a whole row to one thread block when the output is a few values (27 µs per pick of
    129,280 logits in a CUDA graph on the H200, B = 1-64); cut into ARGMAX_PIECES pieces the row spreads over
    the GPU (13-21 µs). Each piece's first maximum, then the first piece holding the largest of those: the
    row's first maximum."""
    v = x.shape[-1]
    if v % ARGMAX_PIECES or v < 64 * ARGMAX_PIECES:
        return x.argmax(-1)
    width = v // ARGMAX_PIECES
    vals, idx = x.unflatten(-1, (ARGMAX_PIECES, width)).max(-1)
    piece = vals.argmax(-1, keepdim=True)
    return (piece * width + idx.gather(-1, piece)).squeeze(-1)


def penalty_histories(seqs: Seq, extra: Seq[list[int]] | None = None) -> tuple[list, list]:
    """(prompt ids, output ids + extra[i]) of each sequence, empty where no penalty reads them: slicing a long
    prompt for every row costs ≈ 15 µs each."""
    extra = extra if extra is not None else [[]] * len(seqs)
    pen = [s.params.has_penalties for s in seqs]
    return ([s.prompt_token_ids if p else [] for s, p in zip(seqs, pen)],
            [s.output_token_ids + e if p else [] for s, p, e in zip(seqs, pen, extra)])


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """The private generator of a seeded request (lives as long as the request)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _history_tensor(ids: Seq[Seq[int]], vocab: int, device: torch.device, what: str) -> torch.Tensor:
    """Pad ragged token lists with `vocab` (a dummy column) into a [R, max_len] int64 tensor."""
    width = max((len(x) for x in ids), default=0)
    out = torch.full((len(ids), max(width, 1)), vocab, dtype=torch.int64)
    for r, row in enumerate(ids):
        if len(row):
            t = torch.as_tensor(list(row), dtype=torch.int64)
            if t.min() < 0 or t.max() >= vocab:
                raise ValueError(f"sampler: {what} token ids of row {r} must lie in [0, {vocab})")
            out[r, : len(row)] = t
    return to_device(out, device)


def apply_logit_bias(logits: torch.Tensor, params: Seq[SamplingParams]) -> torch.Tensor:
    """Logits with each row's `logit_bias` added (a new tensor where any row has one, else `logits` itself)."""
    rows = [i for i, p in enumerate(params) if p.has_logit_bias]
    if not rows:
        return logits
    vocab = logits.shape[1]
    at = [(i, t, b) for i in rows for t, b in params[i].logit_bias.items()]
    bad = next((t for _, t, _ in at if t >= vocab), None)
    if bad is not None:
        raise ValueError(f"sampler: logit_bias token id {bad} is outside the vocabulary [0, {vocab})")
    out = logits.clone()
    row, tok, bias = zip(*at)
    dev = logits.device
    out.index_put_((_on(list(row), dev), _on(list(tok), dev)), _on(list(bias), dev, logits.dtype), accumulate=True)
    return out


def apply_penalties(logits: torch.Tensor, params: Seq[SamplingParams],
                    prompt_token_ids: Seq[Seq[int]], output_token_ids: Seq[Seq[int]]) -> torch.Tensor:
    """Return biased (`apply_logit_bias`), then penalised logits (a new tensor where any row is biased or
    penalised, else `logits` itself)."""
    biased = apply_logit_bias(logits, params)
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return biased
    out = biased if biased is not logits else logits.clone()  # one copy of the logits at most
    vocab, dev = logits.shape[1], logits.device
    outs = _history_tensor([output_token_ids[i] for i in rows], vocab, dev, "output")
    prompts = _history_tensor([prompt_token_ids[i] for i in rows], vocab, dev, "prompt")
    counts = torch.zeros(len(rows), vocab + 1, dtype=logits.dtype, device=dev)
    counts.scatter_add_(1, outs, torch.ones_like(outs, dtype=logits.dtype))
    counts = counts[:, :vocab]
    in_prompt = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=dev)
    in_prompt.scatter_(1, prompts, True)
    seen = in_prompt[:, :vocab] | (counts > 0)

    def col(name: str) -> torch.Tensor:
        return _on([getattr(params[i], name) for i in rows], dev, logits.dtype)[:, None]

    rep, freq, pres = col("repetition_penalty"), col("frequency_penalty"), col("presence_penalty")
    idx = _on(rows, dev)
    x = out[idx]  # (the biased logits of the rows: a copy, written back below)
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - freq * counts - pres * (counts > 0).to(x.dtype)
    out[idx] = x
    return out


def filter_logits(logits: torch.Tensor, params: Seq[SamplingParams]) -> torch.Tensor:
    """Temperature, then min-p, top-k and top-p masks (-inf) for non-greedy rows.

    Greedy rows are returned unchanged (no temperature, no filters)."""
    dev, vocab = logits.device, logits.shape[1]
    temps = _on([p.temperature if p.temperature > 0 else 1.0 for p in params], dev, logits.dtype)
    x = logits / temps[:, None]
    rows = [i for i, p in enumerate(params) if not p.greedy and
            (p.effective_top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0)]
    if not rows:
        return x
    idx = _on(rows, dev)
    sub = x[idx]
    top_k = _on([params[i].effective_top_k or vocab for i in rows], dev)[:, None]
    top_p = _on([params[i].top_p for i in rows], dev, torch.float64)[:, None]
    min_p = _on([params[i].min_p for i in rows], dev, sub.dtype)[:, None]

    # Work in "sorted space": stable descending sort puts equal logits in id order.
    vals, order = torch.sort(sub, dim=-1, descending=True, stable=True)
    probs = torch.softmax(vals, dim=-1)
    keep = probs >= min_p * probs[:, :1]
    keep &= torch.arange(vocab, device=dev)[None, :] < top_k
    # top-p over the survivors, renormalised; a token stays while the mass before it is < top_p.
    kept_probs = torch.softmax(vals.masked_fill(~keep, float("-inf")), dim=-1).double()
    mass_before = torch.cumsum(kept_probs, dim=-1).roll(1, dims=-1)
    mass_before[:, 0] = 0.0
    keep &= (mass_before < top_p) | (top_p >= 1.0)
    masked = vals.masked_fill(~keep, float("-inf"))
    x[idx] = torch.empty_like(sub).scatter_(1, order, masked)
    return x


def token_logprobs(logits: torch.Tensor, tokens: list[int], n_top: int) -> list[TokenLogprob]:
    """Row i of `logits` is the distribution tokens[i] was emitted from (or, for a prompt, the one it is scored
    under): its logprob and the n_top best (ties -> lower ids), from the fp32 log_softmax."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = lp.gather(1, to_device(torch.tensor(tokens, dtype=torch.long), lp.device)[:, None])[:, 0].tolist()
    n = min(n_top, lp.shape[1])
    if n <= 1:  # no full sort of the vocabulary (prompt scoring asks for 0 or 1 alternatives most often)
        vals, ids = lp.max(dim=-1, keepdim=True)  # the first maximum: the lowest id on a tie
    else:
        vals, ids = torch.sort(lp, dim=-1, descending=True, stable=True)
    vals, ids = vals[:, :n].tolist(), ids[:, :n].tolist()
    return [TokenLogprob(t, c, list(zip(i, v))) for t, c, i, v in zip(tokens, chosen, ids, vals)]


class Sampler:
    def __init__(self, logprobs_mode: str = "raw", generator: torch.Generator | None = None) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"Sampler: logprobs_mode={logprobs_mode!r}; expected one of {LOGPROBS_MODES}")
        self.logprobs_mode = logprobs_mode
        self.generator = generator  # for unseeded rows; None = torch's default generator

    def _pick(self, logits: torch.Tensor, params: Seq[SamplingParams], prompt_token_ids: Seq[Seq[int]],
              output_token_ids: Seq[Seq[int]], generators: Seq[torch.Generator | None] | None,
              masks: Seq | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the picked ids [B] on the logits' device, the processed logits); nothing is read back.
        masks: per row a grammar's bitmask or None (`dsv4.engine.structured.grammar_masks`)."""
        batch = len(params)
        if logits.dim() != 2 or logits.shape[0] != batch:
            raise ValueError(f"sampler: logits shape {tuple(logits.shape)} does not match {batch} rows")
        if logits.dtype != torch.float32:
            raise ValueError(f"sampler: logits dtype {logits.dtype}; expected torch.float32")
        if len(prompt_token_ids) != batch or len(output_token_ids) != batch:
            raise ValueError("sampler: prompt_token_ids / output_token_ids need one entry per row")
        generators = list(generators) if generators is not None else [None] * batch
        if len(generators) != batch:
            raise ValueError("sampler: generators needs one entry per row")
        for i, (p, g) in enumerate(zip(params, generators)):
            if p.seed is not None and not p.greedy and g is None:
                raise ValueError(f"sampler: row {i} has seed={p.seed} but no generator (use make_generator)")
            if g is not None and torch.device(g.device).type != logits.device.type:
                raise ValueError(f"sampler: row {i} generator is on {g.device}, logits on {logits.device}")

        penalised = apply_grammar_masks(apply_penalties(logits, params, prompt_token_ids, output_token_ids), masks)
        tokens = first_argmax(penalised)  # first maximum = lowest id; final for greedy rows
        processed = penalised
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        if random_rows:
            processed = filter_logits(penalised, params)
            probs = torch.softmax(processed, dim=-1)
            noise = torch.empty_like(probs)
            if any(generators[i] is None for i in random_rows):
                noise.exponential_(generator=self.generator)
            vocab = logits.shape[1]
            for i in random_rows:
                if generators[i] is not None:
                    noise[i] = torch.empty(vocab, device=logits.device).exponential_(generator=generators[i])
            noise.clamp_min_(torch.finfo(noise.dtype).tiny)  # a zero draw would make 0/0 = nan
            drawn = first_argmax(probs / noise)
            idx = _on(random_rows, logits.device)
            tokens[idx] = drawn[idx]
        return tokens, processed

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, params: Seq[SamplingParams],
                 prompt_token_ids: Seq[Seq[int]], output_token_ids: Seq[Seq[int]],
                 generators: Seq[torch.Generator | None] | None = None, masks: Seq | None = None) -> SamplerOutput:
        """Sample one token per row of `logits` [B, V] (float32)."""
        tokens, processed = self._pick(logits, params, prompt_token_ids, output_token_ids, generators, masks)
        batch = len(params)
        token_list = tokens.tolist()
        logprobs: list[TokenLogprobs | None] = [None] * batch
        lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        if lp_rows:
            source = logits if self.logprobs_mode == "raw" else processed
            idx = _on(lp_rows, logits.device)
            lp = torch.log_softmax(source[idx], dim=-1)
            chosen = _on([token_list[i] for i in lp_rows], logits.device)
            chosen_lp = lp.gather(1, chosen[:, None])
            ranks = (lp > chosen_lp).sum(dim=-1) + 1
            n_max = min(max(params[i].logprobs for i in lp_rows), lp.shape[1])
            top_vals, top_ids = torch.sort(lp, dim=-1, descending=True, stable=True)
            top_vals, top_ids = top_vals[:, :n_max].tolist(), top_ids[:, :n_max].tolist()
            chosen_lp, ranks = chosen_lp[:, 0].tolist(), ranks.tolist()
            for r, i in enumerate(lp_rows):
                n = params[i].logprobs
                logprobs[i] = TokenLogprobs(chosen_lp[r], ranks[r], list(zip(top_ids[r][:n], top_vals[r][:n])))
        return SamplerOutput(token_list, logprobs)

    def sample_sequences(self, logits: torch.Tensor, seqs: Seq) -> SamplerOutput:
        """Sample for `Sequence` objects (row i = seqs[i]); creates each seeded sequence's generator
        on first use, on the logits' device."""
        return self(logits, *self._sequence_args(logits, seqs))

    @torch.inference_mode()
    def pick_sequences(self, logits: torch.Tensor, seqs: Seq) -> torch.Tensor:
        """`sample_sequences`' ids [B], left on the logits' device (nothing read back): the engine's look-ahead,
        for rows without penalties (which read the history) or logprobs (computed from the ids on the host)."""
        if any(s.params.has_penalties or s.params.logprobs is not None for s in seqs):
            raise ValueError("pick_sequences: rows with penalties or logprobs need sample_sequences")
        return self._pick(logits, *self._sequence_args(logits, seqs))[0]

    @staticmethod
    def _sequence_args(logits: torch.Tensor, seqs: Seq) -> tuple[list, list, list, list, list | None]:
        for seq in seqs:
            if seq.params.seed is not None and seq.generator is None:
                seq.generator = make_generator(seq.params.seed, logits.device)
        return ([s.params for s in seqs], *penalty_histories(seqs), [s.generator for s in seqs], grammar_masks(seqs))
