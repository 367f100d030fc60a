"""Completion parsing for DeepSeek-V4: reasoning, content and DSML tool calls (chat_encoding.md §10).

Public API
----------
parse_completion(text, thinking_mode="thinking", *, strict=False,
                 unterminated_reasoning="reasoning") -> dict
    One assistant turn (the text after the generation prompt, EOS included or not) ->
    {"role": "assistant", "reasoning_content": str, "content": str, "tool_calls": [...]},
    each tool call {"type": "function", "function": {"name": str, "arguments": <JSON text>}}.
    strict=True is the reference parser: it raises ChatParseError (a ValueError) on any
    deviation ("missing </think>", "missing EOS token", ...) and its tool calls carry no "id".
    strict=False (serving) never raises on model output; it is StreamingParser run on the whole
    text, so tool calls carry an "id". unterminated_reasoning="content" moves the text of a reply
    that ended with EOS without ever closing its reasoning into `content` (vLLM #48645).
StreamingParser(thinking_mode="thinking", *, in_reasoning=None, make_tool_call_id=None)
    .feed(text_delta) -> list[dict]   OpenAI chat-completion deltas, in order:
        {"reasoning_content": str} | {"content": str} |
        {"tool_calls": [{"index": int, "id": str, "type": "function",
                         "function": {"name": str, "arguments": str}}]}
      A tool call is emitted whole once its </｜DSML｜invoke> has arrived.
    .finish() -> list[dict]           flush held-back text (call once, at the end)
    .result() -> dict                 the message so far, shaped like parse_completion's
    .reasoning_end                    None | "think_close" | "tool_calls" | "eos"
    .saw_eos, .incomplete_tool_call   bool
prompt_ends_in_reasoning(prompt) -> bool
    Whether a rendered prompt leaves the model inside a <think> block (for `in_reasoning`).

Tolerance rules of the streaming parser: markers may be split anywhere across deltas; text that
could be the start of a marker is held back until it is decided; a DSML block ends the reasoning
too (tool calls without </think>); stray <think>, </think> and BOS strings are dropped; text
after EOS is ignored; nothing containing "｜DSML｜" ever reaches content or reasoning.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Callable

from .encoding import ASSISTANT, BOS, DSML, EOS, THINK_CLOSE, THINK_OPEN, TOOL_CALLS_START, to_json

INVOKE_OPEN = f"<{DSML}invoke"
INVOKE_CLOSE = f"</{DSML}invoke"
PARAM_OPEN = f"<{DSML}parameter"
TOOL_CALLS_END = f"</{DSML}tool_calls>"


class ChatParseError(ValueError):
    """A completion that does not follow the DeepSeek-V4 output format (strict parsing)."""


# ---- strict reference parser ------------------------------------------------------------------

def _read_until(text: str, pos: int, stops: list[str]) -> tuple[int, str, str | None]:
    """Text from `pos` to the earliest stop string; returns (position after it, text, stop)."""
    best, hit = len(text), None
    for s in stops:
        k = text.find(s, pos)
        if k != -1 and k < best:
            best, hit = k, s
    if hit is None:
        return len(text), text[pos:], None
    return best + len(hit), text[pos:best], hit


def _arguments_text(params: dict[str, tuple[str, str]]) -> str:
    """Rebuild the JSON object text: string="true" values are quoted, others inserted verbatim."""
    entries = [to_json(k) + ": " + (to_json(v) if flag == "true" else v) for k, (v, flag) in params.items()]
    return "{" + ", ".join(entries) + "}"


def _parse_dsml_strict(text: str, pos: int) -> tuple[int, list[dict]]:
    calls = []
    while True:
        pos, gap, stop = _read_until(text, pos, [INVOKE_OPEN, TOOL_CALLS_END])
        if gap != ">\n":
            raise ChatParseError(f"tool call format error: expected '>\\n', got {gap!r}")
        if stop == TOOL_CALLS_END:
            return pos, calls
        if stop is None:
            raise ChatParseError(f"tool call format error: missing {TOOL_CALLS_END}")
        pos, head, stop = _read_until(text, pos, [PARAM_OPEN, INVOKE_CLOSE])
        m = re.fullmatch(r'\s*name="(.*?)">\n\n?', head, flags=re.S)
        if m is None:
            raise ChatParseError(f"tool name format error: {head!r}")
        params: dict[str, tuple[str, str]] = {}
        while stop == PARAM_OPEN:
            pos, body, stop = _read_until(text, pos, [f"/{DSML}parameter"])
            p = re.fullmatch(r' name="(.*?)" string="(true|false)">(.*?)<', body, flags=re.S)
            if stop is None or p is None:
                raise ChatParseError(f"parameter format error: {body!r}")
            key, flag, value = p.groups()
            if key in params:
                raise ChatParseError(f"duplicate parameter name: {key!r}")
            params[key] = (value, flag)
            pos, gap, stop = _read_until(text, pos, [PARAM_OPEN, INVOKE_CLOSE])
            if gap != ">\n":
                raise ChatParseError(f"parameter format error: expected '>\\n', got {gap!r}")
        if stop != INVOKE_CLOSE:
            raise ChatParseError(f"tool call format error: missing {INVOKE_CLOSE}>")
        calls.append({"type": "function", "function": {"name": m.group(1), "arguments": _arguments_text(params)}})


def _parse_strict(text: str, thinking: bool) -> dict:
    pos, reasoning = 0, ""
    if thinking:
        pos, reasoning, stop = _read_until(text, 0, [THINK_CLOSE, TOOL_CALLS_START])
        if stop != THINK_CLOSE:
            raise ChatParseError("invalid thinking format: missing </think>")
    pos, content, stop = _read_until(text, pos, [EOS, TOOL_CALLS_START])
    calls: list[dict] = []
    if stop == TOOL_CALLS_START:
        pos, calls = _parse_dsml_strict(text, pos)
        pos, tail, stop = _read_until(text, pos, [EOS])
        if tail:
            raise ChatParseError(f"unexpected content after tool calls: {tail!r}")
    elif stop != EOS:
        raise ChatParseError("invalid format: missing EOS token")
    if pos != len(text):
        raise ChatParseError(f"unexpected content after EOS: {text[pos:]!r}")
    for special in (BOS, EOS, THINK_OPEN, THINK_CLOSE, DSML):
        if special in content or special in reasoning:
            raise ChatParseError(f"unexpected special string {special!r} in content or reasoning")
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


# ---- tolerant streaming parser ----------------------------------------------------------------

# Markers searched in reasoning/content text. DSML is found by its core and widened to the "<" or
# "</" before it and up to two newlines (the "\n\n" that precedes a tool-call block).
_TEXT_MARKERS = (DSML, THINK_CLOSE, THINK_OPEN, EOS, BOS)
_HOLD_MARKERS = (THINK_CLOSE, THINK_OPEN, EOS, BOS) + tuple(
    nl + lt + DSML for nl in ("", "\n", "\n\n") for lt in ("", "<", "</"))
_TAIL_LEN = max(len(m) for m in _HOLD_MARKERS) - 1
_NAME_RE = re.compile(r'\s*name\s*=\s*"([^"]*)"')
_PARAM_RE = re.compile(re.escape(PARAM_OPEN) + r'\s+name\s*=\s*"(.*?)"(?:\s+string\s*=\s*"(true|false)")?\s*>'
                       + r"(.*?)" + re.escape(f"</{DSML}parameter>"), re.S)
_MARKER_PREFIXES = frozenset(m[:k] for m in _HOLD_MARKERS for k in range(1, len(m)))


def _held_suffix(buf: str) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of a marker."""
    for k in range(min(len(buf), _TAIL_LEN), 0, -1):
        if buf[-k:] in _MARKER_PREFIXES:
            return k
    return 0


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _tolerant_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of one invoke body, or None when it has no name."""
    name = _NAME_RE.match(body)
    if name is None:
        return None
    params: dict[str, str] = {}
    for key, flag, value in _PARAM_RE.findall(body):
        if flag == "true" or not _is_json(value):
            params[key] = to_json(value)   # invalid "non-string" values degrade to strings
        else:
            params[key] = value
    args = "{" + ", ".join(to_json(k) + ": " + v for k, v in params.items()) + "}"
    return name.group(1), args


def _new_tool_call_id(index: int) -> str:
    return "call_" + uuid.uuid4().hex[:24]


class StreamingParser:
    """Incremental, tolerant parser of one assistant turn (see the module docstring)."""

    def __init__(self, thinking_mode: str = "thinking", *, in_reasoning: bool | None = None,
                 make_tool_call_id: Callable[[int], str] | None = None):
        if thinking_mode not in ("chat", "thinking"):
            raise ValueError(f"thinking_mode: {thinking_mode!r} is not 'chat' or 'thinking'")
        if in_reasoning is None:
            in_reasoning = thinking_mode == "thinking"
        self._state = "reasoning" if in_reasoning else "content"
        self._make_id = make_tool_call_id or _new_tool_call_id
        self._buf = ""          # undecided reasoning/content text
        self._block = ""        # DSML block text, from its opening marker
        self._block_scan = 0    # where the search for the block's end resumes
        self._invoke_pos = 0    # where the search for the next complete invoke resumes
        self._close_scan = 0    # where the search for the next invoke closing tag resumes
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[dict] = []
        self._tail: dict[str, str] = {}   # last emitted characters per channel
        self._finished = False
        self.reasoning_end: str | None = None
        self.saw_eos = False
        self.incomplete_tool_call = False

    # -- public --
    def feed(self, text: str) -> list[dict]:
        if self._finished:
            raise ValueError("StreamingParser.feed: called after finish()")
        self._buf += text
        events: list[dict] = []
        self._run(events, final=False)
        return events

    def finish(self) -> list[dict]:
        if self._finished:
            return []
        events: list[dict] = []
        self._run(events, final=True)
        self._finished = True
        return events

    def result(self) -> dict:
        return {"role": "assistant", "content": "".join(self._content),
                "reasoning_content": "".join(self._reasoning),
                "tool_calls": [dict(c, function=dict(c["function"])) for c in self._calls]}

    # -- state machine --
    def _emit(self, events: list[dict], text: str) -> None:
        if not text:
            return
        if self._state == "reasoning":
            self._reasoning.append(text)
            key = "reasoning_content"
        else:
            self._content.append(text)
            key = "content"
        self._tail[self._state] = (self._tail.get(self._state, "") + text)[-_TAIL_LEN:]
        if events and key in events[-1]:
            events[-1][key] += text
        else:
            events.append({key: text})

    def _leave_reasoning(self, how: str) -> None:
        if self._state == "reasoning" and self.reasoning_end is None:
            self.reasoning_end = how

    def _run(self, events: list[dict], final: bool) -> None:
        while True:
            if self._state == "done":
                self._buf = ""
                return
            if self._state == "tools":
                self._block += self._buf
                self._buf = ""
                if not self._advance_tools(events, final):
                    return
                continue
            if not self._advance_text(events, final):
                return

    def _advance_text(self, events: list[dict], final: bool) -> bool:
        """Reasoning / content: act on the earliest marker; False when waiting for more text.

        Markers are searched in (recently emitted text of this channel + buffer). In well-formed
        output a marker never starts in the emitted part; one that does was glued together from
        pieces around a removed marker or DSML block, so the buffered part of it is discarded.
        This keeps marker strings out of the concatenated reasoning/content, whatever the splits.
        """
        buf = self._buf
        tail = self._tail.get(self._state, "")
        text, off = tail + buf, len(tail)
        hits = [(k, m) for m in _TEXT_MARKERS if (k := text.find(m)) != -1]
        if not hits:
            keep = min(_held_suffix(text), len(buf))
            self._emit(events, buf[:len(buf) - keep])
            held = buf[len(buf) - keep:]
            # At the end, a dangling piece of a special marker is markup, not text.
            if final and held and "<｜" not in held and "｜D" not in held:
                self._emit(events, held)
            self._buf = "" if final else held
            return False
        k, marker = min(hits)
        start, end = k - off, k - off + len(marker)
        if start < 0:
            self._buf = buf[end:]
            return True
        if marker == DSML:
            for opener in ("</", "<"):
                if buf.endswith(opener, 0, start):
                    start -= len(opener)
                    break
            for _ in range(2):
                if buf.endswith("\n", 0, start):
                    start -= 1
            self._emit(events, buf[:start])
            self._leave_reasoning("tool_calls")
            self._block, self._block_scan, self._invoke_pos, self._close_scan = buf[start:], 0, 0, 0
            self._buf = ""
            self._state = "tools"
            return True
        self._emit(events, buf[:start])
        self._buf = buf[end:]
        if marker == THINK_CLOSE and self._state == "reasoning":
            self._leave_reasoning("think_close")
            self._state = "content"
        elif marker == EOS:
            self._leave_reasoning("eos")
            self.saw_eos = True
            self._state = "done"
        elif marker == THINK_OPEN and self._state == "content" and not self._content and not self._calls:
            self._state = "reasoning"   # a chat-mode reply that opens its own <think> block
        return True   # other markers (stray <think>, </think>, BOS) are dropped

    def _next_invoke(self, block: str, end: int) -> str | None:
        """Body of the next complete `<｜DSML｜invoke ...</｜DSML｜invoke>` in block[:end], else None.

        Resumable: each character is scanned about once however the block arrives."""
        start = block.find(INVOKE_OPEN, self._invoke_pos, end)
        if start == -1:
            return None
        body_start = start + len(INVOKE_OPEN)
        while True:
            close = block.find(INVOKE_CLOSE, max(body_start, self._close_scan), end)
            if close == -1:
                self._close_scan = max(body_start, end - len(INVOKE_CLOSE) + 1)
                return None
            j = close + len(INVOKE_CLOSE)
            while j < end and block[j].isspace():
                j += 1
            if j == end:
                self._close_scan = close   # the ">" may still come
                return None
            if block[j] == ">":
                self._invoke_pos = self._close_scan = j + 1
                return block[body_start:close]
            self._close_scan = close + 1   # not a closing tag after all: look further

    def _advance_tools(self, events: list[dict], final: bool) -> bool:
        """DSML block: emit complete invokes; leave at </｜DSML｜tool_calls> or EOS."""
        block = self._block
        ends = [(k, m) for m in (TOOL_CALLS_END, EOS) if (k := block.find(m, self._block_scan)) != -1]
        end, marker = min(ends) if ends else (len(block), None)
        while (body := self._next_invoke(block, end)) is not None:
            call = _tolerant_call(body)
            if call is None:
                continue
            index = len(self._calls)
            tool_call = {"index": index, "id": self._make_id(index), "type": "function",
                         "function": {"name": call[0], "arguments": call[1]}}
            self._calls.append({k: v for k, v in tool_call.items() if k != "index"})
            events.append({"tool_calls": [tool_call]})
        if marker is None and not final:
            self._block_scan = max(0, len(block) - max(len(TOOL_CALLS_END), len(EOS)) + 1)
            return False
        if INVOKE_OPEN in block[self._invoke_pos:end]:
            self.incomplete_tool_call = True   # cut off (EOS or length) in the middle of a call
        self._block = ""
        if marker == TOOL_CALLS_END:
            # Tolerated: text after the block is content again (the reference requires EOS).
            self._buf = block[end + len(marker):]
            self._state = "content"
            return True
        self.saw_eos = self.saw_eos or marker == EOS
        self._state = "done"
        return True


def parse_completion(text: str, thinking_mode: str = "thinking", *, strict: bool = False,
                     unterminated_reasoning: str = "reasoning") -> dict:
    """Parse one assistant turn; see the module docstring."""
    if thinking_mode not in ("chat", "thinking"):
        raise ValueError(f"thinking_mode: {thinking_mode!r} is not 'chat' or 'thinking'")
    if unterminated_reasoning not in ("reasoning", "content"):
        raise ValueError(f"unterminated_reasoning: {unterminated_reasoning!r} is not 'reasoning' or 'content'")
    if strict:
        return _parse_strict(text, thinking_mode == "thinking")
    parser = StreamingParser(thinking_mode)
    parser.feed(text)
    parser.finish()
    message = parser.result()
    if unterminated_reasoning == "content" and parser.reasoning_end == "eos":
        message["content"], message["reasoning_content"] = message["reasoning_content"], ""
    return message


def prompt_ends_in_reasoning(prompt: str) -> bool:
    """True when the last assistant turn of `prompt` opened a <think> block and did not close it."""
    turn = prompt[prompt.rfind(ASSISTANT):] if ASSISTANT in prompt else prompt
    return turn.rfind(THINK_OPEN) > max(turn.rfind(THINK_CLOSE), turn.rfind(EOS))
