"""Translation between OpenAI request fields and dsv4's tokenizer, chat encoding and parser."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..chat.encoding import encode_messages
from ..chat.parser import StreamingParser, parse_completion, prompt_ends_in_reasoning
from ..engine.outputs import RequestOutput
from ..engine.sampling_params import SamplingParams
from .protocol import ChatCompletionRequest, SamplingFields


@dataclass
class RenderedChat:
    prompt: str
    token_ids: list[int]
    thinking_mode: str
    in_reasoning: bool

    def stream_parser(self) -> StreamingParser:
        return StreamingParser(self.thinking_mode, in_reasoning=self.in_reasoning,
                               make_tool_call_id=lambda i: f"call_{uuid.uuid4().hex[:24]}")

    def parse(self, text: str) -> dict:
        parser = self.stream_parser()
        parser.feed(text)
        parser.finish()
        msg = parser.result()
        return {"content": msg["content"] or (None if msg["tool_calls"] else ""),
                "reasoning_content": msg["reasoning_content"] or None,
                "tool_calls": msg["tool_calls"]}


class ChatBridge:
    """Holds the tokenizer (may be None: token-id prompts only) and the model's EOS id."""

    def __init__(self, tokenizer, eos_token_id: int, vocab_size: int):
        self.tokenizer = tokenizer
        self.eos_token_id = eos_token_id
        self.vocab_size = vocab_size

    # ---- prompts -------------------------------------------------------------------------
    def _need_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise ValueError(f"{what} needs a tokenizer, and this model has no tokenizer.json; "
                             "send token ids instead")
        return self.tokenizer

    def completion_prompts(self, prompt: Any) -> list[list[int]]:
        from .app import ApiError
        if isinstance(prompt, str):
            prompts = [prompt]
        elif prompt and isinstance(prompt[0], int):
            prompts = [list(prompt)]
        else:
            prompts = list(prompt)
        out = []
        for p in prompts:
            if isinstance(p, str):
                try:
                    ids = self._need_tokenizer("a text prompt").encode(p)
                except ValueError as e:
                    raise ApiError(400, str(e), param="prompt") from None
            else:
                ids = list(p)
                bad = [t for t in ids if not 0 <= t < self.vocab_size]
                if bad:
                    raise ApiError(400, f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
                                   param="prompt")
            out.append(ids)
        return out

    def render_chat(self, req: ChatCompletionRequest) -> RenderedChat:
        tok = self._need_tokenizer("chat")
        kw = req.chat_template_kwargs
        thinking = False
        if kw is not None:
            for v in (kw.thinking, kw.enable_thinking):
                if v is not None:
                    thinking = v
        effort = (kw.reasoning_effort if kw and kw.reasoning_effort else None) or \
            (req.reasoning_effort if req.reasoning_effort in ("high", "max") else None)
        drop = kw.drop_thinking if kw and kw.drop_thinking is not None else True
        messages = []
        for m in req.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.text()}
            if m.reasoning_content is not None:
                d["reasoning_content"] = m.reasoning_content
            if m.tool_calls:
                d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            messages.append(d)
        tools = None
        if req.tools and req.tool_choice != "none":
            tools = [t.model_dump(exclude_none=True) for t in req.tools]
        mode = "thinking" if thinking else "chat"
        prompt = encode_messages(messages, thinking_mode=mode, drop_thinking=drop,
                                 reasoning_effort=effort, tools=tools)
        return RenderedChat(prompt, tok.encode(prompt), mode, prompt_ends_in_reasoning(prompt))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    # ---- sampling ------------------------------------------------------------------------
    def sampling_params(self, req: SamplingFields, max_tokens: int, *, logprobs: int | None,
                        k: int) -> SamplingParams:
        from .app import ApiError
        seed = req.seed
        if seed is not None and k:
            seed = (seed + k) % (2**63)  # n > 1 with a seed: distinct but reproducible choices
        try:
            return SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0,
                min_p=req.min_p or 0.0,
                repetition_penalty=req.repetition_penalty or 1.0,
                presence_penalty=req.presence_penalty or 0.0,
                frequency_penalty=req.frequency_penalty or 0.0,
                seed=seed, max_tokens=max_tokens, stop=req.stop or [],
                stop_token_ids=req.stop_token_ids or [], ignore_eos=req.ignore_eos, logprobs=logprobs)
        except ValueError as e:
            raise ApiError(400, str(e)) from None

    # ---- logprobs ------------------------------------------------------------------------
    def _tok(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else str(token_id)

    def completion_logprobs(self, outs: list[RequestOutput]) -> dict | None:
        tokens, lps, tops = [], [], []
        for o in outs:
            for lp in o.logprobs or []:
                tokens.append(self._tok(lp.token_id))
                lps.append(lp.logprob)
                tops.append({self._tok(t): v for t, v in lp.top})
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": []}

    def chat_logprobs(self, outs: list[RequestOutput]) -> dict | None:
        content = []
        for o in outs:
            for lp in o.logprobs or []:
                s = self._tok(lp.token_id)
                content.append({"token": s, "logprob": lp.logprob, "bytes": list(s.encode()),
                                "top_logprobs": [{"token": self._tok(t), "logprob": v,
                                                  "bytes": list(self._tok(t).encode())} for t, v in lp.top]})
        return {"content": content}
