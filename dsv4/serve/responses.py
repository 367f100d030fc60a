"""OpenAI's Responses API (`POST /v1/responses`) on top of the chat route's rendering, sampling and parsing.

A request is translated into a chat request (`to_chat_request`): `instructions` becomes a system message, the
`input` items become messages (an assistant turn's reasoning, message and function_call items one assistant
message; function_call_output a tool message), function tools, tool_choice, `text.format` and `reasoning.effort`
their chat counterparts. So the prompt, the grammar of forced tool calls or a JSON schema, and the parsing of the
reply are the chat route's. The reply comes back as output items: reasoning (`reasoning_text` content), message
(`output_text`), function_call. Streaming sends the Responses events (`response.created` ... `response.completed`).

Stateless: nothing is stored (`store` is answered false), so `previous_response_id` / `conversation` are a 400 --
send the whole conversation in `input`. Not supported (400): built-in tools (web search, files, ...), non-text
content, `background`, `truncation: "auto"`.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Literal, Union

from fastapi import Request
from pydantic import Field, ValidationError

from ..engine.outputs import RequestOutput
from .chat_bridge import ChatBridge, RenderedChat, RequestError
from .protocol import MAX_LOGPROBS, MAX_TOOLS, ChatCompletionRequest, ChatTemplateKwargs, SamplingFields, _Lenient

LOGPROBS_INCLUDE = "message.output_text.logprobs"
EFFORTS = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class ResponsesTool(_Lenient):
    type: str
    name: str | None = Field(default=None, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(_Lenient):
    type: str
    name: str | None = None


class TextFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    json_schema: dict | None = Field(default=None, alias="schema")  # ("schema" would shadow BaseModel's)
    strict: bool | None = None


class TextOptions(_Lenient):
    format: TextFormat | None = None


class ReasoningOptions(_Lenient):
    effort: EFFORTS | None = None
    summary: str | None = None  # accepted; the reasoning itself is returned, not a summary


class ResponsesRequest(SamplingFields):
    """The Responses fields dsv4 implements, plus the sampling extensions of the other routes (seed, top_k, stop,
    penalties, structured_outputs, ...)."""
    input: Union[str, list[Any]]  # items checked by `input_messages`, which names the bad one
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    tools: list[ResponsesTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Union[Literal["none", "auto", "required"], ToolChoiceFunction, None] = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningOptions | None = None
    text: TextOptions | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    include: list[str] | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None


# ---- request -> chat request -------------------------------------------------------------------

def _text(content: Any, where: str) -> str | None:
    """A content string, or the text of its parts (input_text / output_text / text; others are refused)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where}.content: expected a string or a list of content parts", "input")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal", "reasoning_text", "summary_text"):
            raise RequestError(f"{where}.content[{j}]: content part type {kind!r} is not supported (text only)",
                               "input")
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise RequestError(f"{where}.content[{j}]: a {kind} part needs a string", "input")
        parts.append(text)
    return "".join(parts)


def _field(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise RequestError(f"{where}: a {item.get('type')} item needs a string {key!r}", "input")
    return value


def input_messages(req: ResponsesRequest) -> list[dict]:
    """Chat messages of `instructions` and `input`. An assistant turn's items (reasoning, message, function_call,
    in the order a response returned them) make one assistant message."""
    messages: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return messages + [{"role": "user", "content": req.input}]
    turn: dict | None = None  # the open assistant message

    def assistant() -> dict:
        nonlocal turn
        if turn is None:
            turn = {"role": "assistant", "content": None}
            messages.append(turn)
        return turn

    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where}: expected an object", "input")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"{where}.role: {role!r} is not one of user, system, developer, assistant",
                                   "input")
            text = _text(item.get("content"), where)
            if role == "assistant":
                msg = assistant()
                msg["content"] = (msg["content"] or "") + (text or "")
            else:
                turn = None
                messages.append({"role": role, "content": text})
        elif kind == "reasoning":
            text = _text(item.get("content") or item.get("summary") or [], where)
            msg = assistant()
            msg["reasoning_content"] = msg.get("reasoning_content", "") + (text or "")
        elif kind == "function_call":
            call = {"id": _field(item, "call_id", where), "type": "function",
                    "function": {"name": _field(item, "name", where), "arguments": _field(item, "arguments", where)}}
            assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            turn = None
            messages.append({"role": "tool", "tool_call_id": _field(item, "call_id", where),
                             "content": _text(item.get("output"), where) or ""})
        else:
            raise RequestError(f"{where}: input item type {kind!r} is not supported (message, reasoning, "
                               "function_call, function_call_output)", "input")
    return messages


def _refuse_unsupported(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None or req.conversation is not None:
        param = "previous_response_id" if req.previous_response_id is not None else "conversation"
        raise RequestError(f"{param} is not supported: this server stores no responses; send the whole "
                           "conversation in input", param)
    if req.background:
        raise RequestError("background responses are not supported", "background")
    if req.truncation == "auto":
        raise RequestError('truncation "auto" is not supported (an input too long for the context is a 400)',
                           "truncation")
    if req.n != 1:
        raise RequestError("n is not supported by the Responses API (one output per response)", "n")
    for i, tool in enumerate(req.tools or []):
        if tool.type != "function":
            raise RequestError(f"tools[{i}]: tool type {tool.type!r} is not supported (function tools only)",
                               "tools")
        if not tool.name:
            raise RequestError(f"tools[{i}]: a function tool needs a name", "tools")


def to_chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that renders, constrains and samples as `req` asks (RequestError for what cannot)."""
    _refuse_unsupported(req)
    body: dict[str, Any] = req.model_dump(include=set(SamplingFields.model_fields) - {"max_tokens"},
                                          exclude_none=True, by_alias=True)
    body["messages"] = input_messages(req)
    if not body["messages"]:
        raise RequestError("input is empty", "input")
    body["max_completion_tokens"] = req.max_output_tokens or req.max_tokens
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(include={"name", "description", "parameters"},
                                                                       exclude_none=True)} for t in req.tools]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceFunction):
        if choice.type != "function" or not choice.name:
            raise RequestError(f"tool_choice type {choice.type!r} is not supported (none, auto, required or "
                               '{"type": "function", "name": ...})', "tool_choice")
        choice = {"type": "function", "function": {"name": choice.name}}
    body["tool_choice"] = choice
    body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.reasoning is not None:
        body["reasoning_effort"] = req.reasoning.effort
    if req.chat_template_kwargs is not None:
        body["chat_template_kwargs"] = req.chat_template_kwargs.model_dump(exclude_none=True)
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type != "text":
        body["response_format"] = {"type": fmt.type}
        if fmt.type == "json_schema":
            if fmt.json_schema is None:
                raise RequestError("text.format: a json_schema format needs a schema", "text")
            body["response_format"]["json_schema"] = {"name": fmt.name, "schema": fmt.json_schema,
                                                      "strict": fmt.strict}
    body["logprobs"] = LOGPROBS_INCLUDE in (req.include or [])
    body["top_logprobs"] = req.top_logprobs
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        raise RequestError(f"{loc}: {first.get('msg')}", "input" if loc.startswith("messages") else None) from None


# ---- reply -> output items -----------------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"  # (OpenAI's ids: resp_..., msg_..., rs_..., fc_...)


def reasoning_tokens(outs: list[RequestOutput], rendered: RenderedChat, think_close_id: int | None) -> int:
    """Generated tokens of the reasoning block: up to its closing token (all of them where it never closed)."""
    if not rendered.in_reasoning or think_close_id is None:
        return 0
    ids = [t for o in outs for t in o.token_ids]
    return ids.index(think_close_id) + 1 if think_close_id in ids else len(ids)


def reasoning_item(text: str) -> dict:
    return {"id": new_id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def message_item(text: str, status: str, logprobs: list | None) -> dict:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "status": status, "content": [part]}


def call_item(call: dict) -> dict:
    fn = call["function"]
    return {"id": new_id("fc"), "type": "function_call", "call_id": call["id"], "name": fn["name"],
            "arguments": fn["arguments"], "status": "completed"}


def status_of(finish: str | None) -> tuple[str, dict | None]:
    """(status, incomplete_details) of a finish reason; "abort" is the server's shutdown timeout."""
    if finish in ("length", "abort"):
        return "incomplete", {"reason": "max_output_tokens" if finish == "length" else "cancelled"}
    return "completed", None


def response_usage(n_in: int, cached: int, n_out: int, n_reasoning: int) -> dict:
    return {"input_tokens": n_in, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": n_reasoning}, "total_tokens": n_in + n_out}


def response_head(req: ResponsesRequest, chat: ChatCompletionRequest, rid: str, model: str) -> dict:
    """The response object's fields that echo the request."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": None,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": False, "temperature": 1.0 if chat.temperature is None else chat.temperature,
            "text": {"format": fmt or {"type": "text"}},
            "tool_choice": (req.tool_choice.model_dump() if isinstance(req.tool_choice, ToolChoiceFunction)
                            else req.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": 1.0 if chat.top_p is None else chat.top_p, "truncation": "disabled",
            "metadata": req.metadata or {}, "user": req.user, "error": None, "incomplete_details": None}


# ---- the route ----------------------------------------------------------------------------------

@dataclass
class Plumbing:
    """What the route shares with the other generation routes (dsv4.serve.app's closures)."""
    bridge: ChatBridge
    model_name: str
    check_model: Callable
    budget: Callable
    admit: Callable
    collect: Callable
    error_event: Callable
    observer: Callable       # start time -> a per-sequence metrics observer
    streaming: Callable      # (events, streams) -> a streaming response that aborts them however it ends
    api_error: Callable      # RequestError -> the exception the app answers with a 400


class Reply:
    """One response's output: its items, built as the parser's deltas arrive, and (streaming) their events."""

    def __init__(self, head: dict, logprobs: bool):
        self.head, self.logprobs = head, logprobs
        self.items: list[dict] = []
        self.open: dict | None = None   # the reasoning or message item receiving text (always the last item)
        self.pending_lp: list = []      # the answer tokens' logprobs not sent with a delta yet
        self.events: list[tuple[str, dict]] = []
        self.seq = 0

    def emit(self, kind: str, **fields) -> None:
        self.events.append((kind, {"type": kind, "sequence_number": self.seq, **fields}))
        self.seq += 1

    def _at(self) -> dict:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _open(self, kind: str) -> None:
        self._close()
        self.open = reasoning_item("") if kind == "reasoning" else message_item("", "in_progress", None)
        self.items.append(self.open)
        self.emit("response.output_item.added", output_index=len(self.items) - 1,
                  item={**self.open, "content": [], "status": "in_progress"})
        if kind == "message":
            if self.logprobs:
                self.open["content"][0]["logprobs"] = []
            self.emit("response.content_part.added", **self._at(), content_index=0,
                      part={"type": "output_text", "text": "", "annotations": []})

    def _close(self) -> None:
        item, self.open = self.open, None
        if item is None:
            return
        part = item["content"][0]
        if item["type"] == "reasoning":
            self.emit("response.reasoning_text.done", **self._at(), content_index=0, text=part["text"])
        else:
            item["status"] = "completed"
            self.emit("response.output_text.done", **self._at(), content_index=0, text=part["text"],
                      logprobs=part.get("logprobs", []))
            self.emit("response.content_part.done", **self._at(), content_index=0, part=part)
        self.emit("response.output_item.done", output_index=len(self.items) - 1, item=item)

    def _text(self, kind: str, text: str) -> None:
        if self.open is None or self.open["type"] != kind:
            self._open(kind)
        part = self.open["content"][0]
        part["text"] += text
        if kind == "reasoning":
            self.emit("response.reasoning_text.delta", **self._at(), content_index=0, delta=text)
            return
        lp, self.pending_lp = self.pending_lp, []
        if self.logprobs:
            part["logprobs"] += lp
        self.emit("response.output_text.delta", **self._at(), content_index=0, delta=text, logprobs=lp)

    def feed(self, deltas: list[dict], logprobs: list | None = None) -> None:
        """Parser deltas ({reasoning_content | content | tool_calls}), and the logprobs of answer tokens (sent
        with the next text delta)."""
        self.pending_lp += logprobs or []
        for d in deltas:
            if d.get("reasoning_content"):
                self._text("reasoning", d["reasoning_content"])
            if d.get("content"):
                self._text("message", d["content"])
            for call in d.get("tool_calls") or []:
                self._close()
                item = call_item(call)
                self.items.append(item)
                at = self._at()
                self.emit("response.output_item.added", output_index=at["output_index"],
                          item={**item, "arguments": "", "status": "in_progress"})
                self.emit("response.function_call_arguments.delta", **at, delta=item["arguments"])
                self.emit("response.function_call_arguments.done", **at, arguments=item["arguments"],
                          name=item["name"])
                self.emit("response.output_item.done", output_index=at["output_index"], item=item)

    def finish(self, finish: str | None, usage: dict) -> dict:
        """Close the open item; the whole response (and, streaming, its last event)."""
        if not self.items:
            self._open("message")  # nothing was said: an empty answer
        if self.pending_lp and self.open is not None and self.open["type"] == "message":
            self.open["content"][0]["logprobs"] += self.pending_lp
        self._close()
        status, details = status_of(finish)
        if status != "completed":
            for item in self.items:
                if item["type"] == "message":
                    item["status"] = "incomplete"
        body = {**self.head, "status": status, "incomplete_details": details, "output": self.items, "usage": usage}
        self.emit("response.completed" if status == "completed" else "response.incomplete", response=body)
        return body

    def drain(self) -> list[bytes]:
        """The events so far, as server-sent events."""
        out = [f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()
               for kind, data in self.events]
        self.events.clear()
        return out


def add_responses_route(app, p: Plumbing) -> None:
    bridge = p.bridge

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request):
        p.check_model(req.model)
        try:
            chat = to_chat_request(req)
            rendered = bridge.render_chat(chat)
            ids = rendered.token_ids
            max_tokens = p.budget(len(ids), chat.max_completion_tokens, "input")
            top = (chat.top_logprobs or 0) if chat.logprobs else None
            params = bridge.sampling_params(chat, max_tokens, logprobs=top, k=0,
                                            structured=bridge.structured_output(chat, rendered))
        except RequestError as e:  # (named as the Responses fields where the chat route's name differs)
            e.param = {"messages": "input", "response_format": "text", "structured_outputs": "text",
                       "max_completion_tokens": "max_output_tokens"}.get(e.param, e.param)
            raise p.api_error(e) from None
        rid, streams = await p.admit([(ids, params)], "resp")
        think_close = bridge.tokenizer.think_close_id
        reply = Reply(response_head(req, chat, new_id("resp"), p.model_name), chat.logprobs)

        def answer_logprobs(outs: list[RequestOutput], new: list[RequestOutput], seen: int) -> list:
            """Logprobs of `new`'s tokens (`seen` tokens came before them) that follow the reasoning block."""
            if not chat.logprobs:
                return []
            skip = reasoning_tokens(outs, rendered, think_close)
            return bridge.chat_logprobs(new)["content"][max(skip - seen, 0):]

        def usage_of(outs: list[RequestOutput]) -> dict:
            last = outs[-1]
            return response_usage(len(ids), last.cached_tokens, last.completion_tokens,
                                  reasoning_tokens(outs, rendered, think_close))

        if not req.stream:
            outs = (await p.collect(request, streams))[0]
            parser = rendered.stream_parser()
            reply.feed(parser.feed("".join(o.text for o in outs)) + parser.finish(), answer_logprobs(outs, outs, 0))
            return reply.finish(outs[-1].finish_reason, usage_of(outs))

        async def events() -> AsyncIterator[bytes]:
            observe, parser, outs, seen = p.observer(time.monotonic()), rendered.stream_parser(), [], 0
            body = {**reply.head, "status": "in_progress", "output": [], "usage": None}
            reply.emit("response.created", response=body)
            reply.emit("response.in_progress", response=body)
            for chunk in reply.drain():
                yield chunk
            try:
                async for o in streams[0]:
                    observe(o)
                    outs.append(o)
                    reply.feed(parser.feed(o.text) + (parser.finish() if o.finished else []),
                               answer_logprobs(outs, [o], seen))
                    seen += len(o.token_ids)
                    if o.finished:
                        reply.finish(o.finish_reason, usage_of(outs))
                    for chunk in reply.drain():
                        yield chunk
            except Exception as e:
                yield p.error_event(e)

        return p.streaming(events(), streams)
