"""Per-request sampling parameters (OpenAI / vLLM semantics).

Disabled values: temperature 0 = greedy; top_k 0 or -1 = off; top_p 1.0 = off; min_p 0.0 = off;
repetition_penalty 1.0, presence_penalty 0.0, frequency_penalty 0.0 = off; max_tokens None = only
the model length bounds the output; logprobs None = off (0 = only the sampled token's logprob);
logit_bias None or {} = off ({token id: bias in [-100, 100]}, added to the model's logits first, as OpenAI's);
prompt_logprobs None = off, n >= 0: each prompt token after the first gets its logprob under the model (the raw
log_softmax of the logits at the position before it) and the n best alternatives. `priority` is for the scheduler
(0 for all = first come, first served).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dsv4.engine.structured import StructuredOutput


MAX_LOGIT_BIAS = 100  # OpenAI's bound


class InvalidSamplingParam(ValueError):
    """A bad field value; `field` names it (the server's 400 reports it as the request's param)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.field = name


def _invalid(name: str, value: Any, allowed: str) -> InvalidSamplingParam:
    return InvalidSamplingParam(name, f"SamplingParams.{name}={value!r} is invalid; expected {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    prompt_logprobs: int | None = None
    # a grammar the output must follow (dsv4.engine.structured.StructuredOutput): JSON schema, regex, choice, Lark
    structured: StructuredOutput | None = None
    # scheduling, not sampling: lower values are admitted first and preempted last, and preempt higher values to
    # get in (vLLM's convention); equal priorities are first come, first served (dsv4.engine.scheduler)
    priority: int = 0
    # with the engine's retention on (retain_finished): also keep a copy of the cache at this many prompt tokens, the
    # part of the prompt the next turn starts with (dsv4.chat.encoding.continuation_tokens). The whole prompt: a
    # fallback for a reply the next turn tokenizes differently; fewer (thinking mode drops the reasoning and
    # re-renders the prompt's end): instead of the finished sequence's cache. None: the finished sequence's only
    retain_prefix: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise _invalid("logit_bias", self.logit_bias, "a dict {token id: bias} or None")
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None  # a copy; {} = off
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        if not _is_number(self.temperature) or self.temperature < 0:
            raise _invalid("temperature", self.temperature, "a finite number >= 0 (0 = greedy)")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise _invalid("top_k", self.top_k, "an integer >= 1, or 0 / -1 to disable")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise _invalid("top_p", self.top_p, "a number in (0, 1]")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise _invalid("min_p", self.min_p, "a number in [0, 1]")
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise _invalid("repetition_penalty", self.repetition_penalty, "a finite number > 0 (1 = off)")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _is_number(v) or not -2 <= v <= 2:
                raise _invalid(name, v, "a number in [-2, 2]")
        if self.seed is not None and not _is_int(self.seed):
            raise _invalid("seed", self.seed, "an integer or None")
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise _invalid("max_tokens", self.max_tokens, "an integer >= 1 or None")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise _invalid("stop", self.stop, "a list of non-empty strings")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise _invalid("stop_token_ids", self.stop_token_ids, "a list of token ids >= 0")
        if not isinstance(self.ignore_eos, bool):
            raise _invalid("ignore_eos", self.ignore_eos, "a bool")
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise _invalid("logprobs", self.logprobs, "an integer >= 0 or None")
        if self.prompt_logprobs is not None and (not _is_int(self.prompt_logprobs) or self.prompt_logprobs < 0):
            raise _invalid("prompt_logprobs", self.prompt_logprobs, "an integer >= 0 or None")
        if not _is_int(self.priority) or not -(2**31) <= self.priority < 2**31:
            raise _invalid("priority", self.priority, "an integer in [-2**31, 2**31)")
        if self.retain_prefix is not None and (not _is_int(self.retain_prefix) or self.retain_prefix < 1):
            raise _invalid("retain_prefix", self.retain_prefix, "an integer >= 1 or None")
        if self.structured is not None:
            if not isinstance(self.structured, StructuredOutput):
                raise _invalid("structured", self.structured, "a StructuredOutput or None")
        for t, b in (self.logit_bias or {}).items():
            if not _is_int(t) or t < 0:
                raise _invalid("logit_bias", self.logit_bias, f"token ids >= 0 as keys (got {t!r})")
            if not _is_number(b) or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS:
                raise _invalid("logit_bias", self.logit_bias,
                               f"biases in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}] (token {t}: {b!r})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def effective_top_k(self) -> int:
        """top_k with both disabled spellings (0, -1) mapped to 0."""
        return max(self.top_k, 0)

    @property
    def has_logit_bias(self) -> bool:
        return self.logit_bias is not None

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)
