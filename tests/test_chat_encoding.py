"""DeepSeek-V4 prompt rendering against the official vectors, the derived cases of cases.json and the
literal blocks of chat_encoding.md; plus structural properties checked on random conversations."""
from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from pathlib import Path

import pytest

from dsv4.chat.encoding import (
    ASSISTANT,
    BOS,
    EOS,
    REASONING_EFFORT_MAX,
    RESPONSE_FORMAT_HEAD,
    THINK_CLOSE,
    THINK_OPEN,
    TOOLS_HEAD,
    TOOLS_TAIL,
    USER,
    attach_tools,
    encode_messages,
)

SHARED = Path(__file__).resolve().parents[2] / "shared"
FIXTURES = SHARED / "fixtures" / "chat_encoding"
SPEC = SHARED / "spec" / "chat_encoding.md"
needs_fixtures = pytest.mark.skipif(not (FIXTURES / "cases.json").is_file(),
                                    reason=f"chat-encoding fixtures not found at {FIXTURES}")


def _cases() -> dict:
    return json.loads((FIXTURES / "cases.json").read_text(encoding="utf-8")) if (FIXTURES / "cases.json").is_file() else {}


def official_messages(case: dict) -> list[dict]:
    """The message list the official test script builds for a case (cases.json `input_layout`)."""
    data = json.loads((FIXTURES / case["input_file"]).read_text(encoding="utf-8"))
    if isinstance(data, dict):
        messages = data["messages"]
        messages[0]["tools"] = data["tools"]
        return messages
    return data


CASES = _cases()


@needs_fixtures
def test_fixture_files_are_the_published_bytes():
    table = re.findall(r"\| `(test_\w+\.(?:json|txt))` \| `([0-9a-f]{64})` \|",
                       (FIXTURES / "README.md").read_text(encoding="utf-8"))
    assert len(table) == 8
    for name, digest in table:
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


@needs_fixtures
@pytest.mark.parametrize("case", CASES.get("official_cases", []), ids=lambda c: c["id"])
def test_official_vectors_byte_exact(case):
    expected = (FIXTURES / case["expected_prompt_file"]).read_bytes().decode("utf-8")
    messages = official_messages(case)
    before = copy.deepcopy(messages)
    prompt = encode_messages(messages, thinking_mode=case["thinking_mode"], **case["encode_options"])
    assert prompt.encode("utf-8") == expected.encode("utf-8")
    assert messages == before, "the encoder must not mutate its input"
    if "expect_prompt_not_contains" in case:
        assert case["expect_prompt_not_contains"] not in prompt


@needs_fixtures
@pytest.mark.parametrize("case", CASES.get("readme_cases", []) + CASES.get("derived_cases", []),
                         ids=lambda c: c["id"])
def test_readme_and_derived_cases_byte_exact(case):
    prompt = encode_messages(case["messages"], thinking_mode=case["thinking_mode"],
                             context=case.get("context"), **case["encode_options"])
    assert prompt == case["expected_prompt"]


@needs_fixtures
def test_request_level_tools_match_case_1():
    """Passing tools on the request attaches them to the system message, as the official script does."""
    case = CASES["official_cases"][0]
    data = json.loads((FIXTURES / case["input_file"]).read_text(encoding="utf-8"))
    expected = (FIXTURES / case["expected_prompt_file"]).read_text(encoding="utf-8")
    assert encode_messages(data["messages"], thinking_mode="thinking", tools=data["tools"]) == expected
    assert "tools" not in data["messages"][0]


@pytest.mark.skipif(not SPEC.is_file(), reason=f"spec not found at {SPEC}")
def test_fixed_blocks_equal_spec_literals():
    """The JSON-string literals of chat_encoding.md §5/§6, in order of appearance."""
    literals = [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", SPEC.read_text(encoding="utf-8"), re.S)]
    assert literals == [REASONING_EFFORT_MAX, TOOLS_HEAD, TOOLS_TAIL, RESPONSE_FORMAT_HEAD]


def test_tools_without_system_message_get_an_empty_one():
    tool = {"type": "function", "function": {"name": "f", "description": "d é/", "parameters": {"x": 0.5}}}
    prompt = encode_messages([{"role": "user", "content": "q"}], thinking_mode="chat", tools=[tool])
    schema = '{"name": "f", "description": "d é/", "parameters": {"x": 0.5}}'
    assert prompt == BOS + "\n\n" + TOOLS_HEAD + schema + TOOLS_TAIL + USER + "q" + ASSISTANT + THINK_CLOSE
    with pytest.raises(ValueError, match="tools"):
        attach_tools([{"role": "system", "content": "", "tools": [tool]}], [tool])


def test_tool_result_content_parts_and_unknown_ids():
    """§3.3: list tool outputs join text parts by a blank line and mark other parts; results whose
    id is unknown sort as position 0 (stable)."""
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "y", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "y", "content": [{"type": "text", "text": "t1"},
                                                          {"type": "image_url", "image_url": {}},
                                                          {"type": "text", "text": "t2"}]},
        {"role": "tool", "tool_call_id": "zzz", "content": "U"},
        {"role": "tool", "tool_call_id": "x", "content": None},
    ]
    prompt = encode_messages(msgs, thinking_mode="chat")
    tail = (USER + "<tool_result>U</tool_result>\n\n<tool_result></tool_result>\n\n"
            "<tool_result>t1\n\n[Unsupported image_url]\n\nt2</tool_result>" + ASSISTANT + THINK_CLOSE)
    assert prompt.endswith(EOS + tail)


def _random_text(rng: random.Random) -> str:
    pieces = ["a", "b", " ", "\n", "中", "😀", "<", ">", '"', "{", "}", "x y"]
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 8)))


def _random_conversation(rng: random.Random, n_turns: int) -> list[dict]:
    msgs: list[dict] = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": _random_text(rng)})
    for _ in range(n_turns):
        msgs.append({"role": "user", "content": _random_text(rng) or "u"})
        if rng.random() < 0.3:
            msgs.append({"role": "latest_reminder", "content": _random_text(rng)})
        asst = {"role": "assistant", "content": _random_text(rng), "reasoning_content": _random_text(rng)}
        if rng.random() < 0.4:
            asst["tool_calls"] = [{"id": f"c{j}", "type": "function",
                                   "function": {"name": "f", "arguments": json.dumps({"k": _random_text(rng), "n": j})}}
                                  for j in range(rng.randrange(1, 3))]
            msgs.append(asst)
            for j in rng.sample(range(len(asst["tool_calls"])), len(asst["tool_calls"])):
                msgs.append({"role": "tool", "tool_call_id": f"c{j}", "content": _random_text(rng)})
            msgs.append({"role": "assistant", "content": _random_text(rng), "reasoning_content": "r"})
        else:
            msgs.append(asst)
    return msgs


def test_context_prefix_property():
    """Without reasoning dropping, rendering is a concatenation: encode(ctx + new) ==
    encode(ctx) + encode(new, context=ctx) whenever ctx ends after an assistant turn."""
    rng = random.Random(1234)
    for trial in range(200):
        mode = rng.choice(["chat", "thinking"])
        msgs = _random_conversation(rng, rng.randrange(2, 4))
        cuts = [i + 1 for i, m in enumerate(msgs[:-1]) if m["role"] == "assistant" and msgs[i + 1]["role"] == "user"]
        if not cuts:
            continue
        cut = rng.choice(cuts)
        ctx, new = msgs[:cut], msgs[cut:] + [{"role": "user", "content": "next"}]
        whole = encode_messages(ctx + new, thinking_mode=mode, drop_thinking=False)
        assert whole == encode_messages(ctx, thinking_mode=mode, drop_thinking=False) + \
            encode_messages(new, thinking_mode=mode, drop_thinking=False, context=ctx)


def test_turn_structure_on_random_conversations():
    """§3.4/§4 consequences: chat mode introduces every assistant turn with <｜Assistant｜></think>
    and renders no reasoning; thinking mode with dropping opens <think> only after the last user
    turn; without dropping every reasoning is rendered and closed; a final user turn ends with the
    generation prompt; there is no text between turns except the turns themselves."""
    rng = random.Random(99)
    for trial in range(200):
        msgs = _random_conversation(rng, rng.randrange(1, 4)) + [{"role": "user", "content": "end"}]
        n_assistant = sum(m["role"] == "assistant" for m in msgs)
        chat = encode_messages(msgs, thinking_mode="chat")
        assert chat.startswith(BOS) and chat.endswith("end" + ASSISTANT + THINK_CLOSE)
        assert THINK_OPEN not in chat and chat.count(EOS) == n_assistant
        # each user turn (tool results merged in) gets one header; the generator never puts two
        # assistants in a row, so there is one per assistant plus the generation prompt
        assert chat.count(ASSISTANT + THINK_CLOSE) == chat.count(ASSISTANT) == n_assistant + 1
        think = encode_messages(msgs, thinking_mode="thinking")
        assert think.endswith("end" + ASSISTANT + THINK_OPEN) and think.count(THINK_OPEN) == 1
        assert think.count(ASSISTANT + THINK_CLOSE) == n_assistant
        kept = encode_messages(msgs, thinking_mode="thinking", drop_thinking=False)
        assert kept.count(ASSISTANT + THINK_OPEN) == n_assistant + 1
        assert kept.count(THINK_CLOSE) == n_assistant
        for m in msgs:
            if m["role"] == "assistant":
                assert m["reasoning_content"] + THINK_CLOSE + m["content"] in kept


def test_reasoning_effort_max_only_in_thinking_at_message_zero():
    msgs = [{"role": "user", "content": "q"}]
    assert encode_messages(msgs, reasoning_effort="max") == BOS + REASONING_EFFORT_MAX + USER + "q" + ASSISTANT + THINK_OPEN
    assert encode_messages(msgs, reasoning_effort="high") == encode_messages(msgs)
    ctx = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert REASONING_EFFORT_MAX not in encode_messages(msgs, context=ctx, reasoning_effort="max")


@pytest.mark.parametrize("kwargs, messages, field", [
    ({"thinking_mode": "think"}, [{"role": "user", "content": "q"}], "thinking_mode"),
    ({"reasoning_effort": "low"}, [{"role": "user", "content": "q"}], "reasoning_effort"),
    ({}, [{"role": "robot", "content": "q"}], r"messages\[0\]\.role"),
    ({}, [{"role": "user", "content": "q", "task": "nope"}], r"messages\[0\]\.task"),
    ({}, [{"role": "developer", "content": ""}], r"message\[0\]\.content"),
    ({}, [{"role": "user", "content": 5}], r"messages\[0\]\.content"),
    ({}, [{"role": "user", "content": [{"type": "image_url"}]}], r"messages\[0\]\.content\[0\]"),
    ({}, [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
     r"message\[1\]\.tool_calls\[0\]\.function\.name"),
    ({}, [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "[1, 2]"}}]}], r"tool_calls\[0\]\.function\.arguments"),
    ({}, [{"role": "system", "content": "s", "tools": [{"name": "f"}]}], r"message\[0\]\.tools\[0\]\.function"),
    ({}, "not a list", "messages"),
])
def test_bad_input_is_a_clear_value_error(kwargs, messages, field):
    with pytest.raises(ValueError, match=field):
        encode_messages(messages, **kwargs)


def test_text_content_parts_render_like_separate_user_messages():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert encode_messages([{"role": "user", "content": parts}], thinking_mode="chat") == \
        encode_messages([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], thinking_mode="chat")


def test_task_ends_a_user_turn_and_developer_dropping():
    """§3.1: a user message with a task is not merged with the next user message. §3.2: with
    dropping, developer messages before the last user turn disappear, so the assistant after one
    gets no header; only new messages are rendered after a context (§3.1.3)."""
    chat = encode_messages([{"role": "user", "content": "q", "task": "query"}, {"role": "user", "content": "b"}],
                           thinking_mode="chat")
    assert chat == BOS + USER + "q" + USER + "b" + ASSISTANT + THINK_CLOSE
    msgs = [{"role": "developer", "content": "d"}, {"role": "assistant", "content": "x", "reasoning_content": "r"},
            {"role": "user", "content": "q"}]
    assert encode_messages(msgs) == BOS + "x" + EOS + USER + "q" + ASSISTANT + THINK_OPEN
    assert encode_messages(msgs, drop_thinking=False) == \
        BOS + USER + "d" + ASSISTANT + THINK_OPEN + "r" + THINK_CLOSE + "x" + EOS + USER + "q" + ASSISTANT + THINK_OPEN
    ctx = [{"role": "developer", "content": "d"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}]
    assert encode_messages([{"role": "user", "content": "q2"}], context=ctx) == USER + "q2" + ASSISTANT + THINK_OPEN
