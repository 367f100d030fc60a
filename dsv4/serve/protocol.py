"""OpenAI-compatible request/response shapes (pydantic) and their validation bounds.

Only what dsv4 implements is declared; unknown fields are ignored like the OpenAI API does, but
values of known fields are validated here, before the engine sees anything (bad input -> 400).
Fields that would change the result but are not implemented (suffix, best_of, non-text content) are refused
with a 400 rather than silently ignored. Structured outputs: chat's `response_format` (OpenAI: json_object,
json_schema) and, on both endpoints, vLLM's `structured_outputs` (json, regex, choice, grammar).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 8
MAX_PROMPTS = 64          # prompts in one /v1/completions request
MAX_STOP = 8
MAX_STOP_LEN = 256
MAX_LOGPROBS = 20
MAX_TOOLS = 128
MAX_MESSAGES = 4096
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS_TOKENS = 1024  # tokens one request may bias
MAX_GRAMMAR_CHARS = 100_000   # a regex or Lark grammar of structured outputs

# OpenAI reasoning_effort -> (thinking on?, DeepSeek-V4 effort). V4 knows "high" and "max".
REASONING_EFFORTS = {"none": (False, None), "minimal": (True, "high"), "low": (True, "high"),
                     "medium": (True, "high"), "high": (True, "high"), "xhigh": (True, "max"),
                     "max": (True, "max")}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Lenient):
    include_usage: bool = False


class StructuredOutputs(_Lenient):
    """vLLM's `structured_outputs` extension: exactly one of json (a schema), json_object, regex, choice, grammar
    (Lark)."""
    json_schema: dict | str | None = Field(default=None, alias="json")  # ("json" would shadow BaseModel's)
    json_object: bool | None = None
    regex: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)
    choice: list[str] | None = Field(default=None, max_length=1024)
    grammar: str | None = Field(default=None, max_length=MAX_GRAMMAR_CHARS)


class SamplingFields(_Lenient):
    model: str | None = Field(default=None, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, le=1_000_000)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, list[str], None] = None
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    ignore_eos: bool = False
    logit_bias: dict[int, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS_TOKENS)  # JSON keys: "id"
    structured_outputs: StructuredOutputs | None = None
    priority: int = Field(default=0, ge=-(2**31), lt=2**31)  # vLLM's: lower values are scheduled first
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: Union[str, list[str], None]) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else list(v)
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        for s in stops:
            if not s:
                raise ValueError("stop sequences must be non-empty")
            if len(s) > MAX_STOP_LEN:
                raise ValueError(f"stop sequences must be at most {MAX_STOP_LEN} characters")
        return stops


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(default=None, ge=0)  # 0: with echo, the prompt scored and nothing generated
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("prompt must not be empty")
            if isinstance(v[0], (list, str)) and len(v) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
            if isinstance(v[0], list) and any(not p for p in v):
                raise ValueError("token-id prompts must not be empty")
        return v


class FunctionDef(_Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionCall(_Lenient):
    name: str
    arguments: str = ""


class ToolCall(_Lenient):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class NamedFunction(_Lenient):
    name: str


class NamedToolChoice(_Lenient):
    type: Literal["function"] = "function"
    function: NamedFunction


class ContentPart(_Lenient):
    type: str
    text: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Union[str, list[ContentPart], None] = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str | None:
        """Flatten OpenAI content parts (only text parts are supported)."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise ValueError(f"unsupported content part type {part.type!r}; only 'text' parts are supported")
            parts.append(part.text)
        return "".join(parts)


class ChatTemplateKwargs(_Lenient):
    thinking: bool | None = None
    enable_thinking: bool | None = None
    reasoning_effort: Literal["high", "max"] | None = None
    drop_thinking: bool | None = None


class ThinkingOption(_Lenient):
    """DeepSeek API style: {"type": "enabled" | "disabled"}."""
    type: Literal["enabled", "disabled"]


class JsonSchemaFormat(_Lenient):
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    json_schema: dict | None = Field(default=None, alias="schema")  # ("schema" would shadow BaseModel's)
    strict: bool | None = None


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    thinking: ThinkingOption | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    response_format: ResponseFormat | None = None


class TokenizeRequest(ChatCompletionRequest):
    """/tokenize: a text `prompt` as /v1/completions encodes it, or `messages` (with the chat options) as
    /v1/chat/completions renders them; exactly one of the two."""
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, max_length=MAX_MESSAGES)


class DetokenizeRequest(_Lenient):
    model: str | None = Field(default=None, max_length=256)
    tokens: list[int] = Field(max_length=1 << 20)


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens taken from the engine's cache (retention, prompt sharing, prefix snapshots)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


def usage(prompt_tokens: int, completion_tokens: int, cached: list[int] = (), per_prompt: int = 1) -> dict:
    """`cached`: each sequence's cached prompt tokens, `per_prompt` sequences (n choices) per prompt in a row; a
    prompt's cached tokens are those none of its sequences computed (a prompt counts once, whatever n)."""
    groups = [cached[i: i + per_prompt] for i in range(0, len(cached), per_prompt)]
    details = PromptTokensDetails(cached_tokens=sum(min(g) for g in groups))
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details).model_dump()


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: Union[str, int, None] = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


MESSAGES_PATH = "/v1/messages"  # Anthropic's Messages API (dsv4.serve.messages): its own error shape
_MESSAGES_ERROR_TYPES = {"server_error": "api_error", "service_unavailable": "overloaded_error"}


def messages_error_body(message: str, type_: str, status: int) -> dict:
    """The Messages API's error shape; OpenAI's error types renamed to Anthropic's."""
    type_ = "request_too_large" if status == 413 else _MESSAGES_ERROR_TYPES.get(type_, type_)
    return {"type": "error", "error": {"type": type_, "message": message}}


def error_body_for(path: str, status: int, message: str, type_: str = "invalid_request_error",
                   param: str | None = None, code: Union[str, int, None] = None) -> dict:
    """The error body of a request to `path`: the Messages API's shape on its routes, else OpenAI's."""
    if path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/"):
        return messages_error_body(message, type_, status)
    return error_body(message, type_, param, status if code is None else code)


def now() -> int:
    return int(time.time())
