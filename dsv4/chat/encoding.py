"""DeepSeek-V4 prompt rendering, byte-exact with the official `encoding_dsv4.py` (chat_encoding.md §1-§7).

Public API
----------
encode_messages(messages, *, thinking_mode="thinking", context=None, drop_thinking=True,
                add_default_bos_token=True, reasoning_effort=None, tools=None,
                response_format=None) -> str
    Render a conversation (OpenAI-like message dicts) to the exact prompt string. The generation
    prompt is implicit, as in the reference: a conversation ending with a user/developer message
    ends with "<｜Assistant｜><think>" (thinking) or "<｜Assistant｜></think>" (chat). An assistant
    message with `wo_eos: true` is rendered open, for continuation. `tools` / `response_format`
    are request-level conveniences, attached with `attach_tools` before rendering.
attach_tools(messages, tools=None, response_format=None) -> list[dict]
    Put request-level tools / response_format on the leading system message (inserting an empty
    one when the conversation does not start with a system message). Does not mutate the input.
to_json(value) -> str
    The JSON serialisation the format uses (json.dumps, ensure_ascii=False, given key order).

Constants: BOS, EOS, USER, ASSISTANT, LATEST_REMINDER, THINK_OPEN, THINK_CLOSE, DSML,
TASK_TOKENS, TOOL_CALLS_START, REASONING_EFFORT_MAX, THINKING_MODES, REASONING_EFFORTS.

Input messages are never mutated. Malformed input raises ValueError naming the offending field
(e.g. "messages[3].tool_calls[0].function.name").
"""
from __future__ import annotations

import json
from typing import Any

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
LATEST_REMINDER = "<｜latest_reminder｜>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
DSML = "｜DSML｜"
TASK_TOKENS = {
    "action": "<｜action｜>",
    "query": "<｜query｜>",
    "authority": "<｜authority｜>",
    "domain": "<｜domain｜>",
    "title": "<｜title｜>",
    "read_url": "<｜read_url｜>",
}
TOOL_CALLS_START = f"\n\n<{DSML}tool_calls"   # what the parser looks for after the content
THINKING_MODES = ("chat", "thinking")
REASONING_EFFORTS = (None, "high", "max")
ROLES = ("system", "user", "assistant", "developer", "latest_reminder", "tool")

REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
    "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
    "and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

TOOLS_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by "
    f"writing a \"<{DSML}tool_calls>\" block like the following:\n\n"
    f"<{DSML}tool_calls>\n"
    f"<{DSML}invoke name=\"$TOOL_NAME\">\n"
    f"<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}parameter>\n"
    "...\n"
    f"</{DSML}invoke>\n"
    f"<{DSML}invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    f"</{DSML}invoke>\n"
    f"</{DSML}tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types "
    "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    f"If thinking_mode is enabled (triggered by {THINK_OPEN}), you MUST output your complete reasoning "
    f"inside {THINK_OPEN}...{THINK_CLOSE} BEFORE any tool calls or final response.\n\n"
    f"Otherwise, output directly after {THINK_CLOSE} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
)
TOOLS_TAIL = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
RESPONSE_FORMAT_HEAD = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"


def to_json(value: Any, field: str = "value") -> str:
    """json.dumps with the format's settings; ValueError naming `field` when not serialisable."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{field}: not JSON-serialisable ({e})") from None


def _text(content: Any, field: str) -> str:
    """Message text: None -> "", str as is, an OpenAI list of text parts joined like content blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"{field}[{j}]: only {{'type': 'text', 'text': str}} content parts are supported")
            parts.append(part["text"])
        return "\n\n".join(parts)
    raise ValueError(f"{field}: expected a string, a list of text parts or None, got {type(content).__name__}")


def _tool_result_text(content: Any) -> str:
    """A tool output; list parts follow the reference: text joined by a blank line, others marked."""
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            parts.append(part.get("text", "") if kind == "text" else f"[Unsupported {kind}]")
        return "\n\n".join(parts)
    return "" if content is None else str(content)


def _checked(messages: Any, where: str) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"{where}: expected a list of message dicts, got {type(messages).__name__}")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"{where}[{i}]: expected a dict, got {type(msg).__name__}")
        if msg.get("role") not in ROLES:
            raise ValueError(f"{where}[{i}].role: {msg.get('role')!r} is not one of {ROLES}")
        task = msg.get("task")
        if task is not None and task not in TASK_TOKENS:
            raise ValueError(f"{where}[{i}].task: {task!r} is not one of {sorted(TASK_TOKENS)}")
    return list(messages)


def attach_tools(messages: list[dict], tools: list[dict] | None = None,
                 response_format: Any = None) -> list[dict]:
    """Attach request-level `tools` / `response_format` to the leading system message."""
    msgs = list(messages)
    if not tools and response_format is None:
        return msgs
    if msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
        system = dict(msgs[0])
        msgs[0] = system
    else:
        system = {"role": "system", "content": ""}
        msgs.insert(0, system)
    if tools:
        if system.get("tools"):
            raise ValueError("tools: given both on the request and on the first system message")
        system["tools"] = list(tools)
    if response_format is not None:
        if system.get("response_format") is not None:
            raise ValueError("response_format: given both on the request and on the first system message")
        system["response_format"] = response_format
    return msgs


# ---- preprocessing (§3.1) ---------------------------------------------------------------------

def _merge_tool_messages(messages: list[dict], where: str) -> list[dict]:
    """Fold `tool` messages and consecutive user messages into user turns made of content blocks."""
    merged: list[dict] = []
    for i, msg in enumerate(messages):
        role = msg["role"]
        last = merged[-1] if merged else None
        if role == "tool":
            block = {"type": "tool_result", "tool_use_id": msg.get("tool_call_id") or "",
                     "content": msg.get("content")}
            if last is not None and last["role"] == "user":
                last["content_blocks"].append(block)
            else:
                merged.append({"role": "user", "content_blocks": [block]})
        elif role == "user":
            block = {"type": "text", "text": _text(msg.get("content"), f"{where}[{i}].content")}
            # A task marks the end of its turn: the next user text starts a new turn.
            if last is not None and last["role"] == "user" and last.get("task") is None:
                last["content_blocks"].append(block)
            else:
                turn = {"role": "user", "content_blocks": [block]}
                for key in ("task", "wo_eos", "mask"):
                    if key in msg:
                        turn[key] = msg[key]
                merged.append(turn)
        else:
            merged.append(dict(msg))
    return merged


def _call_id(call: dict) -> str:
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    return call.get("id") or fn.get("id") or ""


def _sort_tool_results(messages: list[dict]) -> None:
    """Order tool results by the call order of the latest assistant tool_calls (in place)."""
    order: dict[str, int] = {}
    for msg in messages:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            order = {}
            for idx, call in enumerate(msg["tool_calls"]):
                if isinstance(call, dict) and _call_id(call):
                    order[_call_id(call)] = idx
        elif msg["role"] == "user":
            blocks = msg["content_blocks"]
            results = [b for b in blocks if b["type"] == "tool_result"]
            if len(results) > 1 and order:
                ranked = iter(sorted(results, key=lambda b: order.get(b["tool_use_id"], 0)))
                msg["content_blocks"] = [next(ranked) if b["type"] == "tool_result" else b for b in blocks]


def _last_user_index(messages: list[dict]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] in ("user", "developer"):
            return i
    return -1


def _drop_thinking(messages: list[dict]) -> list[dict]:
    """Before the last user turn: drop developer messages and assistant reasoning (§3.2)."""
    last_user = _last_user_index(messages)
    kept = []
    for i, msg in enumerate(messages):
        if i >= last_user or msg["role"] in ("user", "system", "latest_reminder"):
            kept.append(msg)
        elif msg["role"] == "assistant":
            kept.append({k: v for k, v in msg.items() if k != "reasoning_content"})
    return kept


# ---- fixed blocks (§6) ------------------------------------------------------------------------

def _tools_block(tools: Any, field: str) -> str:
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f"{field}: expected a list of tools")
    schemas = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise ValueError(f"{field}[{j}].function: expected {{'type': 'function', 'function': {{...}}}}")
        schemas.append(to_json(tool["function"], f"{field}[{j}].function"))
    return TOOLS_HEAD + "\n".join(schemas) + TOOLS_TAIL


def _instruction_suffix(msg: dict, field: str) -> str:
    """Tools and response-format blocks of a system / developer message."""
    out = ""
    if msg.get("tools"):
        out += "\n\n" + _tools_block(msg["tools"], f"{field}.tools")
    if msg.get("response_format"):
        out += "\n\n" + RESPONSE_FORMAT_HEAD + to_json(msg["response_format"], f"{field}.response_format")
    return out


def _dsml_parameters(arguments: Any, field: str) -> str:
    if arguments is None:
        args: Any = {}
    elif isinstance(arguments, dict):
        args = arguments
    elif isinstance(arguments, str):
        try:
            args = json.loads(arguments)
        except ValueError:
            args = {"arguments": arguments}   # the reference keeps unparsable arguments verbatim
        if not isinstance(args, dict):
            raise ValueError(f"{field}: arguments must encode a JSON object, got {arguments!r}")
    else:
        raise ValueError(f"{field}: arguments must be a JSON string or a dict, got {type(arguments).__name__}")
    lines = []
    for key, value in args.items():
        if isinstance(value, str):
            flag, text = "true", value
        else:
            flag, text = "false", to_json(value, f"{field}.{key}")
        lines.append(f'<{DSML}parameter name="{key}" string="{flag}">{text}</{DSML}parameter>')
    return "\n".join(lines)


def _dsml_tool_calls(calls: Any, field: str) -> str:
    if not calls:
        return ""
    if not isinstance(calls, (list, tuple)):
        raise ValueError(f"{field}: expected a list of tool calls")
    invokes = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"{field}[{j}].function.name: missing or not a string")
        params = _dsml_parameters(fn.get("arguments"), f"{field}[{j}].function.arguments")
        invokes.append(f'<{DSML}invoke name="{fn["name"]}">\n{params}\n</{DSML}invoke>')
    return f"\n\n<{DSML}tool_calls>\n" + "\n".join(invokes) + f"\n</{DSML}tool_calls>"


# ---- rendering (§3.3, §3.4) -------------------------------------------------------------------

def _render_message(i: int, msgs: list[dict], thinking: bool, drop: bool, effort: str | None,
                    last_user: int) -> str:
    msg, role, field = msgs[i], msgs[i]["role"], f"message[{i}]"
    out = REASONING_EFFORT_MAX if (i == 0 and thinking and effort == "max") else ""
    if role == "system":
        out += _text(msg.get("content"), f"{field}.content") + _instruction_suffix(msg, field)
    elif role == "developer":
        content = _text(msg.get("content"), f"{field}.content")
        if not content:
            raise ValueError(f"{field}.content: a developer message needs non-empty content")
        out += USER + content + _instruction_suffix(msg, field)
    elif role == "user":
        parts = []
        for block in msg["content_blocks"]:
            if block["type"] == "text":
                parts.append(block["text"])
            else:
                parts.append("<tool_result>" + _tool_result_text(block["content"]) + "</tool_result>")
        out += USER + "\n\n".join(parts)
    elif role == "latest_reminder":
        out += LATEST_REMINDER + _text(msg.get("content"), f"{field}.content")
    else:  # assistant ("tool" was merged away)
        think = ""
        after_task = i > 0 and msgs[i - 1].get("task") is not None
        if thinking and not after_task and (not drop or i > last_user):
            think = _text(msg.get("reasoning_content"), f"{field}.reasoning_content") + THINK_CLOSE
        out += (think + _text(msg.get("content"), f"{field}.content")
                + _dsml_tool_calls(msg.get("tool_calls"), f"{field}.tool_calls")
                + ("" if msg.get("wo_eos") else EOS))

    # Transition: only before an assistant / latest_reminder message or at the very end.
    if i + 1 < len(msgs) and msgs[i + 1]["role"] not in ("assistant", "latest_reminder"):
        return out
    task = msg.get("task")
    if task == "action":
        out += ASSISTANT + (THINK_OPEN if thinking else THINK_CLOSE) + TASK_TOKENS[task]
    elif task is not None:
        out += TASK_TOKENS[task]
    elif role in ("user", "developer"):
        out += ASSISTANT + (THINK_OPEN if thinking and (not drop or i >= last_user) else THINK_CLOSE)
    return out


def encode_messages(messages: list[dict], *, thinking_mode: str = "thinking",
                    context: list[dict] | None = None, drop_thinking: bool = True,
                    add_default_bos_token: bool = True, reasoning_effort: str | None = None,
                    tools: list[dict] | None = None, response_format: Any = None) -> str:
    """Render `messages` (after the already-encoded `context`, if any) to the prompt string."""
    if thinking_mode not in THINKING_MODES:
        raise ValueError(f"thinking_mode: {thinking_mode!r} is not one of {THINKING_MODES}")
    if reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning_effort: {reasoning_effort!r} is not one of {REASONING_EFFORTS}")
    context = _checked(context or [], "context")
    messages = _checked(messages, "messages")
    if tools or response_format is not None:
        if context:
            raise ValueError("tools/response_format: with a context, put them on the context's system message")
        messages = attach_tools(messages, tools, response_format)

    ctx = _merge_tool_messages(context, "context")
    full = ctx + _merge_tool_messages(messages, "messages")
    _sort_tool_results(full)
    thinking = thinking_mode == "thinking"
    # Tool-using conversations always keep every reasoning block.
    drop = drop_thinking and not any(m.get("tools") for m in full)
    n_context = len(ctx)
    if thinking and drop:
        full = _drop_thinking(full)
        n_context = len(_drop_thinking(ctx))
    last_user = _last_user_index(full)

    prompt = BOS if add_default_bos_token and not context else ""
    for i in range(n_context, len(full)):
        prompt += _render_message(i, full, thinking, drop, reasoning_effort, last_user)
    return prompt


def continuation_prefix(messages: list[dict], prompt: str | None = None, **options: Any) -> int:
    """How much of the prompt `encode_messages(messages, **options)` the next turn's prompt (this turn's reply and
    a new user message added) starts with, in characters: all of it, except where the next turn renders this one's
    end differently -- thinking mode without tools drops the history's reasoning, so this turn's generation prompt
    `<｜Assistant｜><think>` comes back as `<｜Assistant｜></think>`. (Where to keep a cache for that turn.)
    `prompt`: that rendering, where the caller has it."""
    prompt = encode_messages(messages, **options) if prompt is None else prompt
    follow = encode_messages([*messages, {"role": "assistant", "content": ""}, {"role": "user", "content": "?"}],
                             **options)
    n = min(len(prompt), len(follow))
    return next((i for i in range(n) if prompt[i] != follow[i]), n)


def continuation_tokens(tokenizer, ids: list[int], messages: list[dict], prompt: str | None = None,
                        **options: Any) -> int | None:
    """`SamplingParams.retain_prefix` for prompt `ids` (`tokenizer`'s encoding of encode_messages(messages,
    **options)): where the engine should keep a copy of the cache for the next turn. Fewer than all the tokens where
    that turn renders this one's end differently (thinking mode without tools drops the reasoning); else all of
    them: the copy is the fallback beside the finished sequence, whose reply comes back as text that the tokenizer
    may split otherwise than the model did (3 of 20 replies of the embedded model, a tool call's `t`+`rue` for
    `tr`+`ue`); None where no token boundary fits. `prompt`: that rendering, where the caller has it."""
    prompt = encode_messages(messages, **options) if prompt is None else prompt
    at = continuation_prefix(messages, prompt, **options)
    if at >= len(prompt):
        return len(ids)
    return tokenizer.tokens_before(ids, prompt, at) or None
