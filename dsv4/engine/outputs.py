"""What the engine hands back per request and step: incremental deltas."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # (token id, logprob), best first


@dataclass
class RequestOutput:
    """One step's progress of one request. `token_ids`/`text` are the *new* tokens and text."""
    request_id: str
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None  # the stop string or stop token that ended it


@dataclass
class EngineStats:
    num_waiting: int
    num_running: int
    cache_usage: float           # fraction of cache pages in use (max over kinds)
    free_pages: int
    total_pages: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_preemptions: int
