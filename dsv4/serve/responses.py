"""OpenAI's Responses API (`POST /v1/responses`) on top of the chat route's rendering, sampling and parsing.

A request is translated into a chat request (dsv4.serve.responses_request.to_chat_request). So the prompt, the
grammar of forced tool calls or a JSON schema, and the parsing of the reply are the chat route's. The reply comes
back as output items: reasoning (`reasoning_text` content), message (`output_text`), function_call. Streaming
sends the Responses events (`response.created` ... `response.completed`).

Responses are kept in memory (dsv4.serve.response_store, `--responses-store N`, on by default) unless a request
says `store: false`, so `previous_response_id` continues a conversation, and `GET` / `DELETE /v1/responses/{id}`
work; with the store off they are a 400 / 404 (send the whole conversation in `input`). Not supported (400):
`conversation` objects, built-in tools (web search, files, ...), non-text content, `background`,
`truncation: "auto"`.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from fastapi import Request

from ..engine.outputs import RequestOutput
from .chat_bridge import ChatBridge, RenderedChat, RequestError
from .protocol import ChatCompletionRequest
from .response_store import ResponseStore
from .responses_request import ResponsesRequest, ToolChoiceFunction, input_messages, to_chat_request


# ---- reply -> output items -----------------------------------------------------------------------

def named_event(kind: str, data: dict) -> bytes:
    """A server-sent event with an event name (the Responses and Messages APIs' streams)."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def drain_events(events: list[tuple[str, dict]]) -> list[bytes]:
    """`events` (kind, data) as server-sent events; the list is emptied."""
    out = [named_event(kind, data) for kind, data in events]
    events.clear()
    return out


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"  # (OpenAI's ids: resp_..., msg_..., rs_..., fc_...)


class ReasoningCount:
    """Generated tokens of the reasoning block, up to its closing token (all of them while it is open), counted as
    outputs arrive (each token looked at once)."""

    def __init__(self, rendered: RenderedChat, think_close_id: int | None):
        self.think_close_id = think_close_id
        self.open = rendered.in_reasoning and think_close_id is not None
        self.n = 0

    def add(self, outs: list[RequestOutput]) -> int:
        for o in outs:
            for t in o.token_ids:
                if not self.open:
                    return self.n
                self.n += 1
                self.open = t != self.think_close_id
        return self.n


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


def response_head(req: ResponsesRequest, chat: ChatCompletionRequest, rid: str, model: str, store: bool) -> dict:
    """The response object's fields that echo the request."""
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
            "store": store, "temperature": 1.0 if chat.temperature is None else chat.temperature,
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
    check_model: Callable    # the request's model -> the id its reply names (404 for an unknown one)
    budget: Callable
    admit: Callable
    collect: Callable
    error_event: Callable
    observer: Callable       # start time -> a per-sequence metrics observer
    streaming: Callable      # (events, streams) -> a streaming response that aborts them however it ends
    api_error: Callable      # RequestError -> the exception the app answers with a 400
    not_found: Callable      # message -> the exception the app answers with a 404
    store: ResponseStore | None = None  # None: --responses-store 0


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

    def _close(self, status: str = "completed") -> None:
        """End the open text item; `status` "incomplete" where the output was cut inside it."""
        item, self.open = self.open, None
        if item is None:
            return
        part = item["content"][0]
        item["status"] = status
        if item["type"] == "reasoning":
            self.emit("response.reasoning_text.done", **self._at(), content_index=0, text=part["text"])
        else:
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
        status, details = status_of(finish)
        self._close(status)  # (the items closed before were complete)
        body = {**self.head, "status": status, "incomplete_details": details, "output": self.items, "usage": usage}
        self.emit("response.completed" if status == "completed" else "response.incomplete", response=body)
        return body

    def message(self) -> dict:
        """The reply as a chat assistant message (what a stored response adds to its conversation)."""
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(
            i["content"][0]["text"] for i in self.items if i["type"] == "message") or None}
        reasoning = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "reasoning")
        if reasoning:
            msg["reasoning_content"] = reasoning
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in self.items if i["type"] == "function_call"]
        if calls:
            msg["tool_calls"] = calls
        return msg

    def drain(self) -> list[bytes]:
        """The events so far, as server-sent events."""
        return drain_events(self.events)


def add_responses_route(app, p: Plumbing) -> None:
    bridge, store = p.bridge, p.store

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        body = store.get(response_id) if store is not None else None
        if body is None:
            raise p.not_found(f"No response with id {response_id!r} is stored.")
        return body

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        if store is None or not store.delete(response_id):
            raise p.not_found(f"No response with id {response_id!r} is stored.")
        return {"id": response_id, "object": "response", "deleted": True}

    @app.post("/v1/responses")
    async def responses(req: ResponsesRequest, request: Request):
        model = p.check_model(req.model)
        keep = store is not None and req.store is not False
        try:
            history = None
            if store is not None:
                history = store.history(req.previous_response_id) if req.previous_response_id is not None else []
            chat = to_chat_request(req, history)
            rendered = bridge.render_chat(chat)
            ids = rendered.token_ids
            max_tokens = p.budget(len(ids), chat.max_completion_tokens, "input")
            top = (chat.top_logprobs or 0) if chat.logprobs else None
            params = bridge.sampling_params(chat, max_tokens, logprobs=top, k=0,
                                            structured=bridge.structured_output(chat, rendered),
                                            retain_prefix=rendered.retain_prefix)
        except RequestError as e:  # (named as the Responses fields where the chat route's name differs)
            e.param = {"messages": "input", "response_format": "text", "structured_outputs": "text",
                       "max_completion_tokens": "max_output_tokens"}.get(e.param, e.param)
            raise p.api_error(e) from None
        rid, streams = await p.admit([(ids, params)], "resp")
        reasoning = ReasoningCount(rendered, bridge.tokenizer.think_close_id)
        reply = Reply(response_head(req, chat, new_id("resp"), model, keep), chat.logprobs)

        def finish(last: RequestOutput) -> dict:
            usage = response_usage(len(ids), last.cached_tokens, last.completion_tokens, reasoning.n)
            body = reply.finish(last.finish_reason, usage)
            if keep:
                store.put(body["id"], req.previous_response_id, input_messages(req) + [reply.message()], body)
            return body

        def answer_logprobs(new: list[RequestOutput], seen: int) -> list:
            """Logprobs of `new`'s tokens (`seen` tokens came before them) that follow the reasoning block."""
            skip = reasoning.add(new)
            return bridge.chat_logprobs(new)["content"][max(skip - seen, 0):] if chat.logprobs else []

        if not req.stream:
            outs = (await p.collect(request, streams))[0]
            parser = rendered.stream_parser()
            reply.feed(parser.feed("".join(o.text for o in outs)) + parser.finish(), answer_logprobs(outs, 0))
            return finish(outs[-1])

        async def events() -> AsyncIterator[bytes]:
            observe, parser, seen = p.observer(time.monotonic()), rendered.stream_parser(), 0
            body = {**reply.head, "status": "in_progress", "output": [], "usage": None}
            reply.emit("response.created", response=body)
            reply.emit("response.in_progress", response=body)
            for chunk in reply.drain():
                yield chunk
            try:
                async for o in streams[0]:
                    observe(o)
                    reply.feed(parser.feed(o.text) + (parser.finish() if o.finished else []),
                               answer_logprobs([o], seen))
                    seen += len(o.token_ids)
                    if o.finished:
                        finish(o)
                    for chunk in reply.drain():
                        yield chunk
            except Exception as e:
                yield p.error_event(e)

        return p.streaming(events(), streams)
