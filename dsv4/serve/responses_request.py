"""The Responses API's request (`POST /v1/responses`) and its translation into a chat request.

`to_chat_request`: `instructions` becomes a system message, then come the stored conversation's messages (when
`previous_response_id` names one), then the `input` items as messages (an assistant turn's reasoning, message and
function_call items one assistant message; function_call_output a tool message); function tools, tool_choice,
`text.format` and `reasoning.effort` become their chat counterparts. What cannot be served is a RequestError
naming the field.
"""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, ValidationError

from .chat_bridge import RequestError
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
    """Chat messages of `input`. An assistant turn's items (reasoning, message, function_call, in the order a
    response returned them) make one assistant message."""
    messages: list[dict] = []
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
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


def _refuse_unsupported(req: ResponsesRequest, storing: bool) -> None:
    if req.conversation is not None:
        raise RequestError("conversation is not supported: this server stores no conversations; send the whole "
                           "conversation in input", "conversation")
    if req.previous_response_id is not None and not storing:
        raise RequestError("previous_response_id is not supported: this server stores no responses "
                           "(--responses-store 0); send the whole conversation in input", "previous_response_id")
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


def to_chat_request(req: ResponsesRequest, history: list[dict] | None = None) -> ChatCompletionRequest:
    """The chat request that renders, constrains and samples as `req` asks, after the messages of `history` (the
    stored conversation `previous_response_id` continues; None: nothing is stored). RequestError for what cannot."""
    _refuse_unsupported(req, history is not None)
    body: dict[str, Any] = req.model_dump(include=set(SamplingFields.model_fields) - {"max_tokens"},
                                          exclude_none=True, by_alias=True)
    own = input_messages(req)
    if not own:
        raise RequestError("input is empty", "input")
    # (a previous response's instructions are not carried over: OpenAI's rule)
    body["messages"] = ([{"role": "system", "content": req.instructions}] if req.instructions else []) \
        + (history or []) + own
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
