"""One generation request: its tokens, progress through the cache, and stop conditions."""
from __future__ import annotations

from enum import Enum, auto
from typing import Callable, Iterable

from dsv4.engine.sampling_params import SamplingParams

Detokenize = Callable[[list[int]], str]


class SequenceStatus(Enum):
    WAITING = auto()    # queued (new, or preempted and waiting to recompute)
    RUNNING = auto()    # holds pages; scheduled every step until finished
    FINISHED = auto()   # finish_reason says why; pages are freed


FINISH_REASONS = ("stop", "length", "abort")


class Sequence:
    """Token ids are kept in one list (prompt then output) so chunks are cheap slices.

    `num_computed_tokens` counts the leading tokens whose cache state exists; the model computes
    `token_ids[num_computed_tokens : num_computed_tokens + n]` in a step. `block_tables` maps a page
    kind to the page ids this sequence holds (written by the BlockManager)."""

    def __init__(self, request_id: str, prompt_token_ids: Iterable[int],
                 params: SamplingParams | None = None) -> None:
        prompt = list(prompt_token_ids)
        if not prompt:
            raise ValueError(f"request {request_id!r}: prompt_token_ids is empty")
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in prompt):
            raise ValueError(f"request {request_id!r}: prompt_token_ids must be integers >= 0")
        self.request_id = request_id
        self.token_ids: list[int] = prompt
        self.num_prompt_tokens = len(prompt)
        self.params = params if params is not None else SamplingParams()
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.arrival = -1                     # set by Scheduler.add (a counter, not a clock)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None   # matched stop token id / stop string; None for eos/length
        self.output_text: str | None = None   # set only when stop strings are checked; excludes the stop string
        self.num_preemptions = 0
        self.block_tables: dict[str, list[int]] = {}
        # dsv4.engine.paged_state's device copies of the block tables (one for all layers, copied again when changed)
        self.device_tables: dict[str, tuple[list[int], object]] = {}
        self.generator = None                 # torch.Generator of a seeded request (made by the sampler)
        # with params.prompt_logprobs: entry k is prompt token k + 1's TokenLogprob (the cache's forward fills it
        # chunk by chunk; a recompute after preemption finds it filled)
        self.prompt_logprobs: list = []
        # a prefill chunk ends here, and the engine snapshots the state (dsv4.engine.prefix_snapshots); 0: none
        self.snapshot_at = 0
        # a prefill chunk ends here, and the engine retains a copy of the cache (params.retain_prefix); 0: none
        self.retain_at = 0
        # prompt tokens its latest admission took from a cache (retained sequence, fork, snapshot) and did not compute
        self.num_cached_tokens = 0
        self.grammar = None                   # structured output's GrammarState (dsv4.engine.structured)

    # ---- views ---------------------------------------------------------------------------
    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, finish_reason={self.finish_reason!r})")

    def prompt_positions_to_score(self, start: int, num_tokens: int) -> range:
        """With params.prompt_logprobs: the positions of the chunk [start, start + num_tokens) whose logits score a
        prompt token not scored yet (position p scores prompt token p + 1)."""
        return range(max(start, len(self.prompt_logprobs)), min(start + num_tokens, self.num_prompt_tokens - 1))

    # ---- updates -------------------------------------------------------------------------
    def append_token(self, token_id: int) -> None:
        self.token_ids.append(int(token_id))

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        if reason not in FINISH_REASONS:
            raise ValueError(f"request {self.request_id!r}: finish reason {reason!r} not in {FINISH_REASONS}")
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def check_stop(self, eos_token_ids: Iterable[int] = (), max_model_len: int | None = None,
                   detokenize: Detokenize | None = None) -> bool:
        """After a token was appended: finish the sequence if a stop condition holds; return whether it did.

        Order: eos (unless ignore_eos), stop_token_ids, stop strings, max_tokens, max_model_len.
        Stop tokens stay in `output_token_ids`; a matched stop string is cut from `output_text`."""
        p = self.params
        last = self.last_token_id
        if not p.ignore_eos and last in eos_token_ids:
            self.finish("stop")
            return True
        if last in p.stop_token_ids:
            self.finish("stop", last)
            return True
        if p.stop:
            if detokenize is None:
                raise ValueError(f"request {self.request_id!r}: stop strings need a detokenize callable")
            text = detokenize(self.output_token_ids)
            # Whole-text search: detokenizing a longer prefix may rewrite its tail (partial UTF-8).
            hits = [(pos, -len(s), s) for s in p.stop if (pos := text.find(s)) >= 0]
            if hits:
                pos, _, s = min(hits)     # earliest match; longest string on a tie
                self.output_text = text[:pos]
                self.finish("stop", s)
                return True
            self.output_text = text
        if p.max_tokens is not None and self.num_output_tokens >= p.max_tokens:
            self.finish("length")
            return True
        if max_model_len is not None and self.num_tokens >= max_model_len:
            self.finish("length")
            return True
        return False
