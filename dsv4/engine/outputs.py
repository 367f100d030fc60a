"""What the engine hands back per request and step (incremental deltas), and how they are made.

Public API
----------
RequestOutput    one step's *new* tokens / text of one request (plus running counts; the first also carries
                 the prompt's logprobs when asked for)
TokenLogprob     logprob of one generated token and the best alternatives
EngineStats      queue, running and cache-page numbers of an engine core
OutputTracker(request_id, prompt_token_ids, params, tokenizer)
    .update(seq, new_token_ids, logprobs) -> RequestOutput | None
    Turns a `Sequence`'s progress into a delta. Text rules (the same for every core, so the
    server sees one behaviour):
      * the text of the EOS token or of a matched stop token id is not part of the text (the
        token id is still in `token_ids`; finish_reason "stop" says why it ended);
      * a matched stop string and everything after it are cut (the scheduler's `output_text`);
      * while stop strings are active, the last (longest stop - 1) characters are held back,
        so no emitted text is ever taken back;
      * special tokens other than EOS are kept (the chat parser needs </think> and DSML).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence as Seq

from ..chat.detok import IncrementalDetokenizer


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
    # first output of a request with params.prompt_logprobs: one entry per prompt token, None for the first
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # prompt tokens taken from a cache instead of computed (retention, prompt sharing, prefix snapshots)
    cached_tokens: int = 0


@dataclass
class EngineStats:
    num_waiting: int
    num_running: int
    cache_usage: float           # fraction of cache pages in use (max over kinds)
    free_pages: int              # summed over page kinds
    total_pages: int             # summed over page kinds
    prompt_tokens_total: int
    generation_tokens_total: int
    num_preemptions: int
    page_usage: dict[str, float] = field(default_factory=dict)  # per page kind
    shared_pages: int = 0        # pages held by several holders now (forks of a prefix), summed over page kinds
    # speculative decoding (zero when off): verified rows with drafts, draft tokens, accepted drafts
    spec_num_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    # the engine's overlap (zero when off): steps that launched the next batch before reading their ids, and rows
    # of such batches computed for nothing (their sequence stopped on the id read back, or was aborted)
    look_ahead_steps: int = 0
    look_ahead_wasted_rows: int = 0
    # EngineConfig.retain_finished (zero when off): finished sequences holding their pages now, requests that
    # adopted one, and the prompt tokens those did not compute again
    num_retained: int = 0
    num_adopted: int = 0
    adopted_tokens: int = 0
    # EngineConfig.share_prompts (zero when off): requests that copied a running sequence's cache, and the prompt
    # tokens they did not compute
    num_forks: int = 0
    shared_prompt_tokens: int = 0
    # EngineConfig.prefix_snapshots (zero when off): snapshots kept now, snapshots taken since start
    num_snapshots: int = 0
    snapshots_taken: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens emitted per verified speculative row: 1 + accepted drafts per row."""
        return 1.0 + self.spec_accepted_tokens / self.spec_num_drafts if self.spec_num_drafts else 0.0


def aborted_output(request_id: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> RequestOutput:
    """The last delta of a request the engine gave up on (shutdown, failed step)."""
    return RequestOutput(request_id, [], "", True, "abort", prompt_tokens, completion_tokens)


class OutputTracker:
    """Per-request delta builder; call `update` once per step in which the sequence got tokens."""

    def __init__(self, request_id: str, prompt_token_ids: Seq[int], params: Any, tokenizer: Any | None):
        self.request_id = request_id
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self._detok = (IncrementalDetokenizer(tokenizer, context_ids=prompt_token_ids)
                       if tokenizer is not None else None)
        self._holdback = max((len(s) for s in params.stop), default=1) - 1
        self._sent = 0            # characters of text already emitted
        self._num_tokens = 0      # generated tokens seen

    @property
    def num_tokens(self) -> int:
        """Generated tokens already reported."""
        return self._num_tokens

    def update(self, seq: Any, new_token_ids: Seq[int],
               logprobs: list[TokenLogprob] | None = None) -> RequestOutput | None:
        """Delta for the tokens appended to `seq` since the last call; None if nothing to say."""
        first = self._num_tokens == 0 and bool(new_token_ids)
        self._num_tokens += len(new_token_ids)
        finished = seq.is_finished
        text = ""
        if self._detok is not None:
            feed = list(new_token_ids)
            drops_last = finished and seq.finish_reason == "stop" and not isinstance(seq.stop_reason, str)
            if drops_last and feed:
                feed = feed[:-1]   # EOS / stop token: counted, not shown
            if feed:
                self._detok.add_many(feed)
            if finished:
                self._detok.flush()
                full = seq.output_text if isinstance(seq.stop_reason, str) else self._detok.text
                upto = len(full)
            else:
                full = self._detok.text
                upto = len(full) - self._holdback if self.params.stop else len(full)
            if upto > self._sent:
                text = full[self._sent:upto]
                self._sent = upto
        if not new_token_ids and not text and not finished:
            return None
        return RequestOutput(
            request_id=self.request_id, token_ids=list(new_token_ids), text=text, finished=finished,
            finish_reason=seq.finish_reason if finished else None, prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self._num_tokens, logprobs=logprobs, cached_tokens=seq.num_cached_tokens,
            stop_reason=seq.stop_reason if finished else None,
            prompt_logprobs=[None, *seq.prompt_logprobs] if first and self.params.prompt_logprobs is not None else None)
