"""The Python API: `dsv4.LLM(...).generate(prompts, SamplingParams(...))`, `stream`, `chat`."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Sequence as Seq

import torch

from .llm_engine import EngineConfig, LLMEngine
from .outputs import TokenLogprob
from .sampling_params import SamplingParams


@dataclass
class GenerationResult:
    request_id: str
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # with SamplingParams.logprobs: one per token
    prompt_logprobs: list[TokenLogprob | None] | None = None     # with SamplingParams.prompt_logprobs
    cached_tokens: int = 0  # prompt tokens taken from the engine's cache (retention, prompt sharing, snapshots)
    # chat only: the parsed assistant message
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[dict] = field(default_factory=list)


@dataclass
class StreamDelta:
    index: int          # which prompt of the call
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None = None                # with SamplingParams.logprobs: one per token
    prompt_logprobs: list[TokenLogprob | None] | None = None  # the first delta's, with SamplingParams.prompt_logprobs
    cached_tokens: int = 0  # prompt tokens taken from the engine's cache instead of computed


class LLM:
    """Offline generation. `model=None` runs the tiny model shipped inside the package.

    On a GPU the fast path is the default: `cuda_graphs=None` captures the decode steps as CUDA graphs and
    `kv_dtype=None` stores the cache in FP8 (lossless under the reference numerics); pass False / "auto" for
    eager steps / a cache in the model dtype (`dsv4.engine.llm_engine.graphs_by_default`, `default_kv_dtype`)."""

    def __init__(self, model: str | Path | None = None, device: str = "auto", dtype: torch.dtype | None = None,
                 numerics: str = "reference", max_num_seqs: int = 64, max_num_batched_tokens: int = 8192,
                 max_model_len: int = 4096, progress: bool = False, speculative: str | None = None,
                 num_draft_tokens: int = 1, cuda_graphs: bool | None = None, kv_dtype: str | None = None,
                 overlap: bool | None = None, retain_finished: int = 0, share_prompts: bool = True,
                 prefix_snapshots: int = 0, cache_tokens: int | None = None,
                 prefill_graph_tokens: int | None = None):
        ec = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_model_len=max_model_len, speculative=speculative, num_draft_tokens=num_draft_tokens,
                          kv_dtype=kv_dtype, overlap=overlap, retain_finished=retain_finished,
                          share_prompts=share_prompts, prefix_snapshots=prefix_snapshots, cache_tokens=cache_tokens,
                          prefill_graph_tokens=prefill_graph_tokens)
        self.engine = LLMEngine.from_pretrained(model, device=device, dtype=dtype, numerics=numerics,
                                                engine_config=ec, cuda_graphs=cuda_graphs)
        self.tokenizer = self.engine.tokenizer
        self.progress = progress
        self._ids = itertools.count()

    # ---- prompts -------------------------------------------------------------------------
    def _to_ids(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer.json: pass token-id lists as prompts")
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def _normalise(self, prompts) -> list[list[int]]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return [self._to_ids(p) for p in prompts]

    # ---- generation ----------------------------------------------------------------------
    def stream(self, prompts, params: SamplingParams | Seq[SamplingParams] | None = None) -> Iterator[StreamDelta]:
        """Yield deltas as tokens are produced (all prompts batched together)."""
        ids = self._normalise(prompts)
        plist = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(ids)
        if len(plist) != len(ids):
            raise ValueError(f"{len(plist)} SamplingParams for {len(ids)} prompts")
        rids = {}
        try:
            for i, (p_ids, p) in enumerate(zip(ids, plist)):
                rid = f"llm-{next(self._ids)}"
                self.engine.add_request(rid, p_ids, p)
                rids[rid] = i
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.request_id in rids:
                        yield StreamDelta(rids[out.request_id], out.text, out.token_ids, out.finished,
                                          out.finish_reason, out.logprobs, out.prompt_logprobs, out.cached_tokens)
        finally:  # a consumer that stops early must not leave requests holding pages
            for rid in rids:
                self.engine.abort_request(rid)

    def generate(self, prompts, params: SamplingParams | Seq[SamplingParams] | None = None) -> list[GenerationResult]:
        """One result per prompt, in order."""
        ids = self._normalise(prompts)
        results = [GenerationResult(f"{i}", p) for i, p in enumerate(ids)]
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=len(ids), desc="generate", unit="req", file=__import__("sys").stderr)
        for d in self.stream(ids, params):
            r = results[d.index]
            r.text += d.text
            r.token_ids.extend(d.token_ids)
            r.logprobs.extend(d.logprobs or [])
            r.cached_tokens = d.cached_tokens
            if d.prompt_logprobs is not None:
                r.prompt_logprobs = d.prompt_logprobs
            if d.finished:
                r.finish_reason = d.finish_reason
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        return results

    def chat(self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None, *,
             thinking: bool = False, reasoning_effort: str | None = None, tools: list[dict] | None = None
             ) -> list[GenerationResult]:
        """Render conversations with the DeepSeek-V4 chat encoding, generate, parse the replies."""
        from ..chat.encoding import continuation_tokens, encode_messages
        from ..chat.parser import StreamingParser, prompt_ends_in_reasoning
        from .structured import after_reasoning
        if self.tokenizer is None:
            raise ValueError("chat needs a tokenizer; this checkpoint has none")
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        mode = "thinking" if thinking else "chat"
        options = dict(thinking_mode=mode, reasoning_effort=reasoning_effort, tools=tools)
        prompts = [encode_messages(c, **options) for c in convs]
        ids = [self.tokenizer.encode(p) for p in prompts]
        base = params or SamplingParams()
        per_prompt = []
        for c, p, t in zip(convs, prompts, ids):
            # a structured output applies to the answer: after the reasoning, where the prompt opens one
            turn = after_reasoning(base, self.tokenizer.think_close_id) if prompt_ends_in_reasoning(p) else base
            # with retention on, keep the cache where the next turn (this reply added) still matches
            per_prompt.append(replace(turn, retain_prefix=continuation_tokens(self.tokenizer, t, c, p, **options)))
        results = self.generate(ids, per_prompt)
        for prompt, r in zip(prompts, results):
            parser = StreamingParser(mode, in_reasoning=prompt_ends_in_reasoning(prompt))
            parser.feed(r.text)
            parser.finish()
            msg = parser.result()
            r.reasoning_content = msg["reasoning_content"] or None
            r.content = msg["content"]
            r.tool_calls = msg["tool_calls"]
        return results
