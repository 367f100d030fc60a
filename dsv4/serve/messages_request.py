"""Anthropic's Messages API request (`POST /v1/messages`) and its translation into a chat request.

`to_chat_request`: `system` becomes a system message; a user turn's `tool_result` blocks become tool messages
(before its text, as the API orders them) and its text blocks one user message; an assistant turn's `thinking`,
`text` and `tool_use` blocks become one assistant message (reasoning, content, tool calls); tools (`input_schema`),
`tool_choice` (auto / any / tool / none), `thinking` (enabled / adaptive / between_tools / disabled;
`budget_tokens` is accepted but not enforced: the model ends its reasoning itself), `output_config` (`effort`: low
to high are V4's high, xhigh and max its max; `format`: a JSON schema the answer follows) and `stop_sequences`
become their chat counterparts. The sampling fields the API has dropped (temperature, top_p, top_k) and the other
routes' extensions (seed, min_p, penalties, structured_outputs, ...) are accepted too. What cannot
be served (images, documents, server tools) is a RequestError naming the field.
"""
from __future__ import annotations

import json
from typing import Any, Literal, Union

from pydantic import Field, ValidationError

from .chat_bridge import RequestError
from .protocol import MAX_MESSAGES, MAX_TOOLS, ChatCompletionRequest, SamplingFields, _Lenient


class MessagesTool(_Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # "custom" or absent; server tools ("web_search_...", "bash_...") are refused


class MessagesToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Lenient):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=1)  # accepted, not enforced


class OutputFormat(_Lenient):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")  # ("schema" would shadow BaseModel's)


class OutputConfig(_Lenient):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # V4 knows high and max
    format: OutputFormat | None = None


class MessagesRequest(SamplingFields):
    """The Messages fields dsv4 implements, plus the sampling extensions of the other routes."""
    max_tokens: int = Field(ge=1)
    messages: list[Any] = Field(min_length=1, max_length=MAX_MESSAGES)  # checked by `chat_messages`
    system: Union[str, list[Any], None] = None
    stop_sequences: list[str] | None = None
    tools: list[MessagesTool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: MessagesToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(MessagesRequest):
    """`/v1/messages/count_tokens`: a message request without max_tokens."""
    max_tokens: int | None = Field(default=None, ge=1)


def _blocks(content: Any, where: str) -> list[dict]:
    """A content string as one text block, or the list of blocks (each an object with a type)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise RequestError(f"{where}.content: expected a string or a list of content blocks", "messages")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise RequestError(f"{where}.content[{j}]: expected a content block object with a type", "messages")
    return content


def _string(block: dict, key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise RequestError(f"{where}: a {block['type']} block needs a string {key!r}", "messages")
    return value


def _text_of(content: Any, where: str) -> str:
    """The text of a tool result's or the system prompt's content (a string, or text blocks)."""
    if content is None:
        return ""
    parts = []
    for j, block in enumerate(_blocks(content, where)):
        if block["type"] != "text":
            raise RequestError(f"{where}.content[{j}]: block type {block['type']!r} is not supported here "
                               "(text only)", "messages")
        parts.append(_string(block, "text", f"{where}.content[{j}]"))
    return "\n".join(parts)


def _user_messages(content: Any, where: str) -> list[dict]:
    results, texts = [], []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.content[{j}]"
        if block["type"] == "text":
            texts.append(_string(block, "text", at))
        elif block["type"] == "tool_result":
            results.append({"role": "tool", "tool_call_id": _string(block, "tool_use_id", at),
                            "content": _text_of(block.get("content"), at)})
        else:
            raise RequestError(f"{at}: block type {block['type']!r} is not supported in a user turn (text, "
                               "tool_result)", "messages")
    return results + ([{"role": "user", "content": "\n".join(texts)}] if texts or not results else [])


def _assistant_message(content: Any, where: str) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}.content[{j}]"
        if block["type"] == "text":
            msg["content"] = (msg["content"] or "") + _string(block, "text", at)
        elif block["type"] == "thinking":
            msg["reasoning_content"] = msg.get("reasoning_content", "") + _string(block, "thinking", at)
        elif block["type"] == "redacted_thinking":
            continue  # another model's encrypted reasoning: nothing this one can read
        elif block["type"] == "tool_use":
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise RequestError(f"{at}: a tool_use block needs an object 'input'", "messages")
            msg.setdefault("tool_calls", []).append(
                {"id": _string(block, "id", at), "type": "function",
                 "function": {"name": _string(block, "name", at), "arguments": json.dumps(args, ensure_ascii=False)}})
        else:
            raise RequestError(f"{at}: block type {block['type']!r} is not supported in an assistant turn (text, "
                               "thinking, redacted_thinking, tool_use)", "messages")
    return msg


def chat_messages(req: MessagesRequest) -> list[dict]:
    """The chat messages of `system` and `messages`."""
    out = [{"role": "system", "content": _text_of(req.system, "system")}] if req.system else []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out += _user_messages(m.get("content"), where)
        elif role == "assistant":
            out.append(_assistant_message(m.get("content"), where))
        else:
            raise RequestError(f"{where}.role: {role!r} is not one of user, assistant (the system prompt goes in "
                               "`system`)", "messages")
    return out


def _tool_choice(req: MessagesRequest) -> Any:
    choice = req.tool_choice
    if choice is None:
        return None
    if choice.type == "tool":
        if not choice.name:
            raise RequestError('tool_choice: {"type": "tool"} needs the tool\'s name', "tool_choice")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def to_chat_request(req: MessagesRequest) -> ChatCompletionRequest:
    """The chat request that renders, constrains and samples as `req` asks; RequestError for what cannot."""
    if req.n != 1:
        raise RequestError("n is not supported by the Messages API (one message per request)", "n")
    for i, tool in enumerate(req.tools or []):
        if tool.type not in (None, "custom"):
            raise RequestError(f"tools[{i}]: tool type {tool.type!r} is not supported (custom tools only)", "tools")
    body: dict[str, Any] = req.model_dump(include=set(SamplingFields.model_fields) - {"max_tokens", "stop"},
                                          exclude_none=True, by_alias=True)
    body["messages"] = chat_messages(req)
    body["max_completion_tokens"] = req.max_tokens
    body["stop"] = req.stop_sequences
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.input_schema}} for t in req.tools]
    body["tool_choice"] = _tool_choice(req)
    if req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use:
        body["parallel_tool_calls"] = False
    if req.thinking is not None:
        body["thinking"] = {"type": "disabled" if req.thinking.type == "disabled" else "enabled"}
    out = req.output_config
    if out is not None and out.effort is not None:
        body["reasoning_effort"] = out.effort  # (thinking on unless `thinking` turns it off)
    if out is not None and out.format is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                          "schema": out.format.json_schema}}
    if req.metadata and isinstance(req.metadata.get("user_id"), str):
        body["user"] = req.metadata["user_id"]
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()))
        param = "stop_sequences" if loc.startswith("stop") else "messages" if loc.startswith("messages") else None
        raise RequestError(f"{loc}: {first.get('msg')}", param) from None
