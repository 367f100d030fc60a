"""Translation between OpenAI request fields and dsv4's tokenizer, chat encoding and parser.

Every problem with a request raises `RequestError` (a ValueError with the offending field), which
the app answers with a 400.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from ..chat.encoding import continuation_tokens, encode_messages
from ..chat.parser import StreamingParser, prompt_ends_in_reasoning
from ..chat.tool_grammar import tool_call_grammar
from ..engine.outputs import RequestOutput
from ..engine.sampling_params import SamplingParams
from ..engine.structured import StructuredOutput
from .protocol import REASONING_EFFORTS, ChatCompletionRequest, NamedToolChoice, SamplingFields


class RequestError(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def tool_call_id(_: int = 0) -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class RenderedChat:
    prompt: str
    token_ids: list[int]
    thinking_mode: str
    in_reasoning: bool
    # the leading tokens the conversation's next turn starts with (all, or all but the last where thinking mode
    # drops the reasoning): SamplingParams.retain_prefix, so the engine's retention keeps a copy of the cache there
    retain_prefix: int | None = None

    def stream_parser(self) -> StreamingParser:
        return StreamingParser(self.thinking_mode, in_reasoning=self.in_reasoning, make_tool_call_id=tool_call_id)

    def parse(self, text: str) -> dict:
        """The whole reply -> {content, reasoning_content, tool_calls} (OpenAI message fields)."""
        parser = self.stream_parser()
        parser.feed(text)
        parser.finish()
        msg = parser.result()
        return {"content": msg["content"] or (None if msg["tool_calls"] else ""),
                "reasoning_content": msg["reasoning_content"] or None,
                "tool_calls": msg["tool_calls"]}


class ChatBridge:
    """Holds the tokenizer (None: token-id completions only), the vocabulary size and the
    server's default thinking mode."""

    def __init__(self, tokenizer, vocab_size: int, *, default_thinking: bool = False):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.default_thinking = default_thinking

    # ---- prompts -------------------------------------------------------------------------
    def _need_tokenizer(self, what: str):
        if self.tokenizer is None:
            raise RequestError(f"{what} needs a tokenizer, and this model has no tokenizer.json; "
                               "send token ids to /v1/completions instead", "prompt")
        return self.tokenizer

    def check_ids(self, ids, param: str) -> None:
        """A 400 naming `param` for the first token id outside the vocabulary."""
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"{param}: token id {bad} is outside the vocabulary [0, {self.vocab_size})", param)

    def completion_prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt[0], int):
            prompts = [list(prompt)]
        else:
            prompts = list(prompt)
        out = []
        for p in prompts:
            if isinstance(p, str):
                ids = self._encode(self._need_tokenizer("a text prompt"), p, "prompt")
            else:
                ids = list(p)
                self.check_ids(ids, "prompt")
            out.append(ids)
        return out

    def thinking_options(self, req: ChatCompletionRequest) -> tuple[bool, str | None]:
        """(thinking on?, DeepSeek effort). Precedence: chat_template_kwargs, `thinking`,
        `reasoning_effort`, the server default."""
        thinking, effort = self.default_thinking, None
        if req.reasoning_effort is not None:
            thinking, effort = REASONING_EFFORTS[req.reasoning_effort]
        if req.thinking is not None:
            thinking = req.thinking.type == "enabled"
        kw = req.chat_template_kwargs
        if kw is not None:
            for flag in (kw.enable_thinking, kw.thinking):
                if flag is not None:
                    thinking = flag
            if kw.reasoning_effort is not None:
                effort = kw.reasoning_effort
        return thinking, effort

    def render_chat(self, req: ChatCompletionRequest) -> RenderedChat:
        tok = self._need_tokenizer("chat")
        thinking, effort = self.thinking_options(req)
        kw = req.chat_template_kwargs
        drop = kw.drop_thinking if kw and kw.drop_thinking is not None else True
        messages = []
        try:
            for m in req.messages:
                d: dict[str, Any] = {"role": m.role, "content": m.text()}
                if m.reasoning_content is not None:
                    d["reasoning_content"] = m.reasoning_content
                if m.tool_calls:
                    d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
                if m.tool_call_id is not None:
                    d["tool_call_id"] = m.tool_call_id
                messages.append(d)
        except ValueError as e:
            raise RequestError(str(e), "messages") from None
        tools = self._tools_for_prompt(req)
        mode = "thinking" if thinking else "chat"
        options = dict(thinking_mode=mode, drop_thinking=drop, reasoning_effort=effort, tools=tools)
        try:
            prompt = encode_messages(messages, **options)
        except ValueError as e:
            raise RequestError(str(e), "messages") from None
        ids = self._encode(tok, prompt, "messages")
        return RenderedChat(prompt, ids, mode, prompt_ends_in_reasoning(prompt),
                            continuation_tokens(tok, ids, messages, prompt, **options))

    @staticmethod
    def _encode(tok, text: str, param: str) -> list[int]:
        try:
            return tok.encode(text)
        except (TypeError, ValueError) as e:   # e.g. text the tokenizer cannot take
            raise RequestError(f"{param}: cannot be tokenized ({e})", param) from None

    @staticmethod
    def _tools_for_prompt(req: ChatCompletionRequest) -> list[dict] | None:
        """tool_choice "none" hides the tools; a named function shows only that one ("required" and a named
        function are enforced by a grammar: `structured_output`)."""
        choice = req.tool_choice
        if not req.tools:
            if choice not in (None, "none", "auto"):
                raise RequestError("tool_choice needs a non-empty tools list", "tool_choice")
            return None
        if choice == "none":
            return None
        tools = [t.model_dump(exclude_none=True) for t in req.tools]
        if isinstance(choice, NamedToolChoice):
            tools = [t for t in tools if t["function"]["name"] == choice.function.name]
            if not tools:
                raise RequestError(f"tool_choice names function {choice.function.name!r}, which is not in tools",
                                   "tool_choice")
        return tools

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else ""

    # ---- structured outputs ----------------------------------------------------------------
    def structured_output(self, req: SamplingFields, rendered: RenderedChat | None = None) -> StructuredOutput | None:
        """The grammar a request's output follows: chat's response_format, the structured_outputs extension, or
        a DSML tool-call block for tool_choice "required" / a named function (one of the three); in thinking mode
        it applies from the end of the reasoning block on."""
        fmt = getattr(req, "response_format", None)
        fmt = fmt if fmt is not None and fmt.type != "text" else None
        so = req.structured_outputs
        choice = getattr(req, "tool_choice", None)
        forced = getattr(req, "tools", None) and (choice == "required" or isinstance(choice, NamedToolChoice))
        if fmt is not None and so is not None:
            raise RequestError("give response_format or structured_outputs, not both", "structured_outputs")
        if forced and (fmt is not None or so is not None):
            raise RequestError("tool_choice forces a tool call: give response_format / structured_outputs, or a "
                               "forced tool_choice, not both", "tool_choice")
        if fmt is None and so is None and not forced:
            return None
        if self.tokenizer is None:
            raise RequestError("structured outputs need a tokenizer, and this model has none",
                               "response_format" if fmt is not None else "structured_outputs")
        after = self.tokenizer.think_close_id if rendered is not None and rendered.in_reasoning else None
        if forced:
            return self._forced_tool_calls(req, after)
        try:
            if fmt is None:
                return StructuredOutput(json=so.json_schema, json_object=bool(so.json_object), regex=so.regex,
                                        choice=so.choice, grammar=so.grammar, start_after=after)
            if fmt.type == "json_object":
                return StructuredOutput(json_object=True, start_after=after)
            if fmt.json_schema is None or fmt.json_schema.json_schema is None:
                raise ValueError("response_format json_schema needs json_schema.schema")
            return StructuredOutput(json=fmt.json_schema.json_schema, start_after=after)
        except ValueError as e:
            raise RequestError(str(e), "structured_outputs" if fmt is None else "response_format") from None

    def _forced_tool_calls(self, req: ChatCompletionRequest, after: int | None) -> StructuredOutput | None:
        """tool_choice "required" / a named function: a grammar of the DSML call block for the tools shown (None
        where the vocabulary has no DSML token: the tools are shown, the call is not enforced)."""
        dsml = self.tokenizer.dsml_id
        if dsml is None:
            return None
        choice = req.tool_choice
        only = choice.function.name if isinstance(choice, NamedToolChoice) else None
        try:
            grammar = tool_call_grammar(self._tools_for_prompt(req), dsml, only=only,
                                        parallel=req.parallel_tool_calls is not False)
        except ValueError as e:
            raise RequestError(str(e), "tools") from None
        return StructuredOutput(grammar=grammar, start_after=after)

    # ---- sampling ------------------------------------------------------------------------
    def sampling_params(self, req: SamplingFields, max_tokens: int, *, logprobs: int | None,
                        k: int, prompt_logprobs: int | None = None, structured: StructuredOutput | None = None,
                        retain_prefix: int | None = None) -> SamplingParams:
        seed = req.seed
        if seed is not None and k:
            seed = (seed + k) % (2**63)  # n > 1 with a seed: distinct but reproducible choices
        stop_ids = req.stop_token_ids or []
        self.check_ids(stop_ids, "stop_token_ids")
        self.check_ids(req.logit_bias or {}, "logit_bias")
        if req.stop and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer, and this model has none", "stop")
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
                stop_token_ids=stop_ids, ignore_eos=req.ignore_eos, logprobs=logprobs, logit_bias=req.logit_bias,
                prompt_logprobs=prompt_logprobs, structured=structured, priority=req.priority,
                retain_prefix=retain_prefix)
        except ValueError as e:
            raise RequestError(str(e), getattr(e, "field", None)) from None

    # ---- logprobs ------------------------------------------------------------------------
    def _tok(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"token_id:{token_id}"

    def completion_logprobs(self, outs: list[RequestOutput], text_offset: int = 0,
                            prompt_ids: list[int] | None = None) -> dict:
        """OpenAI's completion logprobs of `outs`' tokens, preceded (echo) by the prompt's where an output carries
        them (`prompt_ids`: their tokens; the first has no logprob: null, as OpenAI's)."""
        tokens, lps, tops, offsets = [], [], [], []
        for o in outs:
            for t, lp in zip(prompt_ids or [], o.prompt_logprobs or []):
                s = self._tok(t)
                tokens.append(s)
                lps.append(None if lp is None else lp.logprob)
                tops.append(None if lp is None else self._top(lp))
                offsets.append(text_offset)
                text_offset += len(s)
            for lp in o.logprobs or []:
                s = self._tok(lp.token_id)
                tokens.append(s)
                lps.append(lp.logprob)
                tops.append(self._top(lp))
                offsets.append(text_offset)
                text_offset += len(s)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def _top(self, lp) -> dict[str, float]:
        top: dict[str, float] = {}
        for t, v in lp.top:   # tokens that decode alike share a key: keep the best
            top.setdefault(self._tok(t), v)
        return top

    def chat_logprobs(self, outs: list[RequestOutput]) -> dict:
        content = []
        for o in outs:
            for lp in o.logprobs or []:
                s = self._tok(lp.token_id)
                content.append({"token": s, "logprob": lp.logprob, "bytes": list(s.encode()),
                                "top_logprobs": [{"token": self._tok(t), "logprob": v,
                                                  "bytes": list(self._tok(t).encode())} for t, v in lp.top]})
        return {"content": content}
