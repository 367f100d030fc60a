"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) on the chat route's rendering,
sampling and parsing.

DeepSeek's own platform serves V4 through this API too, so Anthropic clients and agents (the `anthropic` SDK,
coding agents) can talk to dsv4 unchanged: a request is translated into a chat request
(dsv4.serve.messages_request), and the reply comes back as content blocks -- `thinking` (no signature: there
is nothing to verify), `text`, `tool_use` (the parsed DSML call, its arguments as the `input` object) -- with
`stop_reason` end_turn / max_tokens / stop_sequence / tool_use. Streaming sends the Messages events (`message_start`,
`content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`). Usage counts the prompt tokens taken
from the engine's cache as `cache_read_input_tokens`, the rest as `input_tokens` (the API's split). The API key
may come as `x-api-key` (the SDK's header) or `Authorization: Bearer`; errors have the API's shape
(`{"type": "error", "error": {"type", "message"}}`).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, AsyncIterator

from fastapi import Request

from ..engine.async_engine import EngineStopped
from ..engine.outputs import RequestOutput
from .chat_bridge import RequestError
from .messages_request import CountTokensRequest, MessagesRequest, to_chat_request
from .protocol import MESSAGES_PATH, messages_error_body
from .responses import Plumbing, drain_events, named_event, new_id

log = logging.getLogger(__name__)


def stop_reason(last: RequestOutput, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished output; `called`: the reply holds tool calls."""
    if last.finish_reason == "length":
        return "max_tokens", None
    if isinstance(last.stop_reason, str):
        return "stop_sequence", last.stop_reason
    return ("tool_use" if called else "end_turn"), None


def tool_input(arguments: str) -> dict:
    """A parsed call's arguments text as the `input` object (the parser writes a JSON object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message_usage(n_in: int, cached: int, n_out: int) -> dict:
    return {"input_tokens": n_in - cached, "output_tokens": n_out, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}


class MessageReply:
    """One reply's content blocks, built as the parser's deltas arrive, and (streaming) their events."""

    def __init__(self, head: dict):
        self.head = head
        self.blocks: list[dict] = []
        self.open: dict | None = None  # the thinking or text block receiving text (always the last block)
        self.events: list[tuple[str, dict]] = []

    def emit(self, kind: str, **fields) -> None:
        self.events.append((kind, {"type": kind, **fields}))

    def _start(self, block: dict, shown: dict | None = None) -> None:
        self._stop()
        self.blocks.append(block)
        self.emit("content_block_start", index=len(self.blocks) - 1, content_block=shown or dict(block))

    def _stop(self) -> None:
        if self.open is not None:
            self.open = None
            self.emit("content_block_stop", index=len(self.blocks) - 1)

    def _text(self, kind: str, text: str) -> None:
        key = "thinking" if kind == "thinking" else "text"
        if self.open is None or self.open["type"] != kind:
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" else \
                {"type": "text", "text": ""}
            self._start(block)
            self.open = block
        self.open[key] += text
        self.emit("content_block_delta", index=len(self.blocks) - 1, delta={"type": f"{key}_delta", key: text})

    def feed(self, deltas: list[dict]) -> None:
        """Parser deltas ({reasoning_content | content | tool_calls})."""
        for d in deltas:
            if d.get("reasoning_content"):
                self._text("thinking", d["reasoning_content"])
            if d.get("content"):
                self._text("text", d["content"])
            for call in d.get("tool_calls") or []:
                fn = call["function"]
                block = {"type": "tool_use", "id": call["id"], "name": fn["name"],
                         "input": tool_input(fn["arguments"])}
                self._start(block, {**block, "input": {}})
                at = len(self.blocks) - 1
                self.emit("content_block_delta", index=at,
                          delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
                self.emit("content_block_stop", index=at)

    def finish(self, last: RequestOutput, usage: dict) -> dict:
        """Close the open block; the whole message (and, streaming, its last events)."""
        self._stop()
        reason, sequence = stop_reason(last, any(b["type"] == "tool_use" for b in self.blocks))
        self.emit("message_delta", delta={"stop_reason": reason, "stop_sequence": sequence}, usage=usage)
        self.emit("message_stop")
        return {**self.head, "content": self.blocks, "stop_reason": reason, "stop_sequence": sequence,
                "usage": usage}

    def drain(self) -> list[bytes]:
        return drain_events(self.events)


def add_messages_route(app, p: Plumbing) -> None:
    bridge = p.bridge

    def render(req: MessagesRequest):
        try:
            chat = to_chat_request(req)
            return chat, bridge.render_chat(chat)
        except RequestError as e:
            raise p.api_error(e) from None

    @app.post(MESSAGES_PATH + "/count_tokens")
    async def count_tokens(req: CountTokensRequest):
        p.check_model(req.model)
        return {"input_tokens": len(render(req)[1].token_ids)}

    @app.post(MESSAGES_PATH)
    async def messages(req: MessagesRequest, request: Request):
        model = p.check_model(req.model)
        chat, rendered = render(req)
        ids = rendered.token_ids
        try:
            max_tokens = p.budget(len(ids), chat.max_completion_tokens, "messages")
            params = bridge.sampling_params(chat, max_tokens, logprobs=None, k=0,
                                            structured=bridge.structured_output(chat, rendered),
                                            retain_prefix=rendered.retain_prefix)
        except RequestError as e:
            raise p.api_error(e) from None
        _, streams = await p.admit([(ids, params)], "msg")
        head: dict[str, Any] = {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model}
        reply = MessageReply(head)

        if not req.stream:
            outs = (await p.collect(request, streams))[0]
            parser = rendered.stream_parser()
            reply.feed(parser.feed("".join(o.text for o in outs)) + parser.finish())
            last = outs[-1]
            return reply.finish(last, message_usage(len(ids), last.cached_tokens, last.completion_tokens))

        async def events() -> AsyncIterator[bytes]:
            observe, parser = p.observer(time.monotonic()), rendered.stream_parser()
            reply.emit("message_start", message={**head, "content": [], "stop_reason": None, "stop_sequence": None,
                                                 "usage": message_usage(len(ids), 0, 0)})
            for chunk in reply.drain():
                yield chunk
            try:
                async for o in streams[0]:
                    observe(o)
                    reply.feed(parser.feed(o.text) + (parser.finish() if o.finished else []))
                    if o.finished:
                        reply.finish(o, message_usage(len(ids), o.cached_tokens, o.completion_tokens))
                    for chunk in reply.drain():
                        yield chunk
            except Exception as e:
                if not isinstance(e, EngineStopped):
                    log.error("stream failed: %r", e)
                body = (messages_error_body(str(e), "service_unavailable", 503) if isinstance(e, EngineStopped)
                        else messages_error_body("internal server error", "server_error", 500))
                yield named_event("error", body)

        return p.streaming(events(), streams)
