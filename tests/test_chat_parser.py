"""Completion parsing: the strict reference parser against cases.json, round trips through the encoder
(official vectors and random assistant turns), and the tolerant StreamingParser under every chunking."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from dsv4.chat.encoding import ASSISTANT, BOS, DSML, EOS, TASK_TOKENS, THINK_CLOSE, THINK_OPEN, USER, encode_messages
from dsv4.chat.parser import ChatParseError, StreamingParser, parse_completion, prompt_ends_in_reasoning

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "chat_encoding"
needs_fixtures = pytest.mark.skipif(not (FIXTURES / "cases.json").is_file(),
                                    reason=f"chat-encoding fixtures not found at {FIXTURES}")
CASES = json.loads((FIXTURES / "cases.json").read_text(encoding="utf-8")) if (FIXTURES / "cases.json").is_file() else {}
MARKERS = (BOS, EOS, THINK_OPEN, THINK_CLOSE, DSML)


def official_messages(case: dict) -> list[dict]:
    data = json.loads((FIXTURES / case["input_file"]).read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data["messages"][0]["tools"] = data["tools"]
        return data["messages"]
    return data


def official_prompt(case: dict) -> str:
    return (FIXTURES / case["expected_prompt_file"]).read_text(encoding="utf-8")


def stream(text: str, cuts: list[int], thinking_mode: str = "thinking", **kw) -> tuple[StreamingParser, list[dict]]:
    parser = StreamingParser(thinking_mode, make_tool_call_id=lambda i: f"id{i}", **kw)
    events, last = [], 0
    for cut in sorted(cuts) + [len(text)]:
        events += parser.feed(text[last:cut])
        last = cut
    return parser, events + parser.finish()


def from_events(events: list[dict]) -> dict:
    """Rebuild the message from OpenAI deltas alone, the way a streaming client would."""
    out = {"reasoning_content": "", "content": "", "tool_calls": []}
    for ev in events:
        assert len(ev) == 1
        if "tool_calls" in ev:
            (call,) = ev["tool_calls"]
            assert call["index"] == len(out["tool_calls"]) and call["type"] == "function"
            out["tool_calls"].append({"name": call["function"]["name"], "arguments": call["function"]["arguments"]})
        else:
            (key, text), = ev.items()
            assert key in ("reasoning_content", "content") and text
            out[key] += text
    return out


def calls_of(message: dict) -> list[dict]:
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]


def assert_stream_equals(text: str, expected: dict, thinking_mode: str, cuts_list) -> None:
    """Every chunking yields the same deltas-rebuilt message, equal to `expected` (strict parse)."""
    want = {"reasoning_content": expected["reasoning_content"], "content": expected["content"],
            "tool_calls": calls_of(expected)}
    for cuts in cuts_list:
        parser, events = stream(text, cuts, thinking_mode)
        got = from_events(events)
        assert got == want, (cuts, text)
        res = parser.result()
        assert {"reasoning_content": res["reasoning_content"], "content": res["content"],
                "tool_calls": calls_of(res)} == want


def chunkings(text: str, rng: random.Random, n_random: int = 20) -> list[list[int]]:
    n = len(text)
    out = [[], list(range(1, n))]                 # whole, and one character at a time
    out += [[k] for k in range(1, n)]             # every single split point
    out += [sorted(rng.sample(range(1, n), min(n - 1, rng.randrange(1, 12)))) for _ in range(n_random) if n > 1]
    return out


# ---- strict parser against cases.json -----------------------------------------------------------

@needs_fixtures
@pytest.mark.parametrize("case", CASES.get("derived_parse_cases", []) +
                         [p for c in CASES.get("readme_cases", []) for p in c["parse_checks"]],
                         ids=lambda c: repr(c["completion_text"][:24]))
def test_derived_parse_cases(case):
    text, mode = case["completion_text"], case["thinking_mode"]
    if "expect_error" in case:
        with pytest.raises(ChatParseError, match=re.escape(case["expect_error"])):
            parse_completion(text, mode, strict=True)
        return
    assert parse_completion(text, mode, strict=True) == case["expect"]
    assert_stream_equals(text, case["expect"], mode, chunkings(text, random.Random(0)))


def _completion(prompt: str, spec: dict) -> str:
    marker = spec["marker"]
    start = (prompt.index(marker) if spec["from"].startswith("after first") else prompt.rindex(marker)) + len(marker)
    if spec["to"] == "end of prompt":
        return prompt[start:]
    assert spec["to"] == "before next occurrence of <｜User｜>"
    return prompt[start:prompt.index(USER, start)]


@needs_fixtures
@pytest.mark.parametrize("case", CASES.get("official_cases", []), ids=lambda c: c["id"])
def test_official_parse_checks(case):
    prompt = official_prompt(case)
    for check in case["parse_checks"]:
        text = _completion(prompt, check["completion"])
        msg = parse_completion(text, check["thinking_mode"], strict=True)
        exp = check["expect"]
        assert msg["reasoning_content"] == exp["reasoning_content"]
        if "content" in exp:
            assert msg["content"] == exp["content"]
        if "content_contains" in exp:
            assert exp["content_contains"] in msg["content"]
        if "tool_calls" in exp:
            assert msg["tool_calls"] == exp["tool_calls"]
        if "tool_calls_count" in exp:
            assert len(msg["tool_calls"]) == exp["tool_calls_count"]
            assert msg["tool_calls"][0]["function"]["name"] == exp["tool_call_0_name"]
            assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == exp["tool_call_0_arguments_json"]


# ---- round trips ---------------------------------------------------------------------------------

def assistant_turns(prompt: str) -> list[tuple[str, str]]:
    """(mode, completion) for every assistant turn of a rendered prompt: the text after each
    <｜Assistant｜> header up to and including its EOS; "<think>" opens a thinking turn."""
    turns = []
    for seg in prompt.split(ASSISTANT)[1:]:
        end = seg.find(EOS)
        if end == -1:
            continue                                   # the generation prompt
        seg = seg[:end + len(EOS)]
        mode = "thinking" if seg.startswith(THINK_OPEN) else "chat"
        seg = seg[len(THINK_OPEN if mode == "thinking" else THINK_CLOSE):]
        if seg.startswith(TASK_TOKENS["action"]):
            seg = seg[len(TASK_TOKENS["action"]):]
        turns.append((mode, seg))
    return turns


@needs_fixtures
@pytest.mark.parametrize("case", CASES.get("official_cases", []), ids=lambda c: c["id"])
def test_official_vectors_round_trip(case):
    """Each assistant turn of the published prompts parses back to the message it was rendered from
    (reasoning only where the header opened <think>), under every chunking of the stream."""
    messages = [m for m in official_messages(case) if m["role"] == "assistant"]
    turns = assistant_turns(official_prompt(case))
    assert len(turns) == len(messages)
    rng = random.Random(7)
    for (mode, text), msg in zip(turns, messages):
        parsed = parse_completion(text, mode, strict=True)
        assert parsed["reasoning_content"] == (msg.get("reasoning_content") or "" if mode == "thinking" else "")
        assert parsed["content"] == (msg.get("content") or "")
        want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed["tool_calls"]] == want
        assert_stream_equals(text, parsed, mode, chunkings(text, rng, n_random=10))


TEXT_PIECES = ["a", "Z", " ", "\n", "\n\n", "<", ">", "/", "｜", "DSML", "think", "end", "▁", "中文", "😀", '"', "=",
               "{", "}", "\\", "[1]", "true"]


def random_text(rng: random.Random, max_pieces: int = 10) -> str:
    return "".join(rng.choice(TEXT_PIECES) for _ in range(rng.randrange(0, max_pieces)))


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 2 else 5)
    if kind == 0:
        return random_text(rng)
    if kind == 1:
        return rng.randrange(-10**6, 10**6)
    if kind == 2:
        return rng.choice([0.5, -1e-06, 3.141592653589793, 1e21])
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return random_text(rng) + "\nline2"
    if kind == 5:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 3))]
    return {f"k{j}": random_value(rng, depth + 1) for j in range(rng.randrange(0, 3))}


def random_assistant(rng: random.Random) -> dict:
    msg = {"role": "assistant", "content": random_text(rng), "reasoning_content": random_text(rng)}
    if rng.random() < 0.6:
        msg["tool_calls"] = [
            {"type": "function", "function": {
                "name": rng.choice(["get_weather", "search", "f", "open_url"]),
                "arguments": json.dumps({f"p{j}_{rng.randrange(99)}": random_value(rng)
                                         for j in range(rng.randrange(0, 4))}, ensure_ascii=rng.random() < 0.5)}}
            for _ in range(rng.randrange(1, 4))]
    return msg


def test_random_assistant_turns_round_trip():
    """encode([user, assistant]) minus encode([user]) is the completion the model would produce; the
    strict and the streaming parser both recover the assistant message from it."""
    rng = random.Random(2024)
    checked = 0
    while checked < 300:
        mode = rng.choice(["chat", "thinking"])
        user = {"role": "user", "content": "q"}
        msg = random_assistant(rng)
        prefix = encode_messages([user], thinking_mode=mode)
        full = encode_messages([user, msg], thinking_mode=mode)
        assert full.startswith(prefix)
        text = full[len(prefix):]
        n_calls = len(msg.get("tool_calls", []))
        n_params = sum(len(json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", []))
        # skip draws whose random text happens to spell a marker across a boundary
        if (text.count(EOS) != 1 or text.count(THINK_CLOSE) != (mode == "thinking") or THINK_OPEN in text
                or text.count(DSML) != (2 + 2 * n_calls + 2 * n_params if n_calls else 0)):
            continue
        checked += 1
        parsed = parse_completion(text, mode, strict=True)
        assert parsed["reasoning_content"] == (msg["reasoning_content"] if mode == "thinking" else "")
        assert parsed["content"] == msg["content"]
        want = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls", [])]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed["tool_calls"]] == want
        cuts = [sorted(rng.sample(range(1, len(text)), rng.randrange(1, min(30, len(text))))) for _ in range(3)]
        assert_stream_equals(text, parsed, mode, cuts + [list(range(1, len(text)))])


# ---- tolerant behaviour ----------------------------------------------------------------------------

CALL = ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n'
        '<｜DSML｜parameter name="x" string="false">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>')


@pytest.mark.parametrize("text, mode, reasoning, content, n_calls, strict_error", [
    # no </think>: everything is reasoning (the stream cannot know better), EOS stripped
    ("just an answer" + EOS, "thinking", "just an answer", "", 0, "missing </think>"),
    # no EOS (length stop): the strict parser needs it, the tolerant one does not
    ("r" + THINK_CLOSE + "partial", "thinking", "r", "partial", 0, "missing EOS token"),
    # tool calls inside the reasoning, without </think>
    ("let me call" + CALL + EOS, "thinking", "let me call", "", 1, "missing </think>"),
    # a call cut off by the length limit: no markup leaks, no call is invented
    ("r" + THINK_CLOSE + "c" + CALL[:70], "thinking", "r", "c", 0, "format error"),
    # the length limit hit inside the opening marker: the dangling markup piece is dropped
    ("r" + THINK_CLOSE + "abc\n\n<｜DSML", "thinking", "r", "abc", 0, "missing EOS token"),
    # stray markers are dropped
    (THINK_OPEN + "r" + THINK_CLOSE + "a" + THINK_CLOSE + "b" + BOS + EOS, "thinking", "r", "ab", 0, "special"),
    # text after the tool-call block is content again; text after EOS is ignored
    ("r" + THINK_CLOSE + CALL + "more" + EOS + "junk", "thinking", "r", "more", 1, "after tool calls"),
    # a chat-mode reply that opens its own think block
    (THINK_OPEN + "r" + THINK_CLOSE + "a" + EOS, "chat", "r", "a", 0, "special"),
    # malformed parameters degrade to strings instead of breaking the JSON
    ('x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="g">\n<｜DSML｜parameter name="v" string="false">not json'
     '</｜DSML｜parameter>\n<｜DSML｜parameter name="w">7</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>' + EOS,
     "chat", "", "x", 1, "format error"),
])
def test_tolerant_parsing(text, mode, reasoning, content, n_calls, strict_error):
    with pytest.raises(ChatParseError, match=strict_error):
        parse_completion(text, mode, strict=True)
    msg = parse_completion(text, mode)
    assert (msg["reasoning_content"], msg["content"], len(msg["tool_calls"])) == (reasoning, content, n_calls)
    for call in msg["tool_calls"]:
        json.loads(call["function"]["arguments"])
        assert call["id"].startswith("call_")
    rng = random.Random(len(text))
    for cuts in chunkings(text, rng, n_random=5):
        parser, events = stream(text, cuts, mode)
        got = from_events(events)
        assert (got["reasoning_content"], got["content"], len(got["tool_calls"])) == (reasoning, content, n_calls)


def test_truncated_call_and_unterminated_reasoning_flags():
    parser, _ = stream("r" + THINK_CLOSE + CALL[:70], [], "thinking")
    assert parser.incomplete_tool_call and not parser.saw_eos and parser.reasoning_end == "think_close"
    parser, _ = stream("answer" + EOS, [3], "thinking")
    assert parser.reasoning_end == "eos" and parser.saw_eos
    moved = parse_completion("answer" + EOS, "thinking", unterminated_reasoning="content")
    assert (moved["reasoning_content"], moved["content"]) == ("", "answer")
    # a reply cut by the length limit keeps its (unfinished) reasoning as reasoning
    cut = parse_completion("still thinking", "thinking", unterminated_reasoning="content")
    assert (cut["reasoning_content"], cut["content"]) == ("still thinking", "")
    parsed = parse_completion('x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="g">\n<｜DSML｜parameter name="v" '
                              'string="false">not json</｜DSML｜parameter>\n<｜DSML｜parameter name="w">7'
                              '</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>', "chat")
    assert json.loads(parsed["tool_calls"][0]["function"]["arguments"]) == {"v": "not json", "w": 7}


FUZZ_PIECES = [THINK_CLOSE, THINK_OPEN, EOS, BOS, "\n\n<｜DSML｜tool_calls>\n", '<｜DSML｜invoke name="f">\n',
               '<｜DSML｜parameter name="k" string="true">', '<｜DSML｜parameter name="n" string="false">',
               "</｜DSML｜parameter>\n", "</｜DSML｜invoke>\n", "</｜DSML｜tool_calls>", DSML, "<｜", "｜", "<", "</",
               "/", "think>", "DSML", "\n", "abc", "中文", "😀", "5", "{", '"', "end▁of▁sentence｜>",
               "</｜DSML｜invoke", " ", ">", "</｜DSML｜parameter"]


def test_fuzz_no_markup_leaks_and_chunking_invariance():
    """Arbitrary marker soup: never raises, never lets a marker string into reasoning or content,
    and every chunking gives the same deltas-rebuilt message and the same result()."""
    rng = random.Random(31337)
    n_with_calls = 0
    for trial in range(500):
        mode = rng.choice(["chat", "thinking"])
        if trial % 2:
            text = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randrange(0, 25)))
        else:   # a well-formed turn with a few random cuts, duplications and insertions
            prefix = encode_messages([{"role": "user", "content": "q"}], thinking_mode=mode)
            text = encode_messages([{"role": "user", "content": "q"}, random_assistant(rng)], thinking_mode=mode)[len(prefix):]
            for _ in range(rng.randrange(0, 4)):
                a = rng.randrange(len(text) + 1)
                b = min(len(text), a + rng.randrange(1, 30))
                text = rng.choice([text[:a] + text[b:], text[:b] + text[a:], text[:a] + rng.choice(FUZZ_PIECES) + text[a:]])
        ref_parser, ref_events = stream(text, [], mode)
        ref = from_events(ref_events)
        for field in ("reasoning_content", "content"):
            for marker in MARKERS:
                assert marker not in ref[field], (text, field, marker)
        assert calls_of(ref_parser.result()) == ref["tool_calls"]
        for call in ref["tool_calls"]:
            assert isinstance(json.loads(call["arguments"]), dict)
        cut_sets = [sorted(rng.sample(range(1, len(text)), rng.randrange(1, min(8, len(text))))) for _ in range(4)] \
            if len(text) > 1 else []
        for cuts in cut_sets + [list(range(1, len(text)))]:
            parser, events = stream(text, cuts, mode)
            assert from_events(events) == ref, (text, cuts)
            assert parser.result() == ref_parser.result()
        n_with_calls += bool(ref["tool_calls"])
    assert n_with_calls > 100


def test_feed_after_finish_is_an_error():
    parser = StreamingParser("chat")
    parser.feed("a")
    parser.finish()
    with pytest.raises(ValueError, match="finish"):
        parser.feed("b")
    with pytest.raises(ValueError, match="thinking_mode"):
        StreamingParser("reasoning")


def test_prompt_ends_in_reasoning_matches_the_encoder():
    q = [{"role": "user", "content": "q"}]
    assert prompt_ends_in_reasoning(encode_messages(q, thinking_mode="thinking"))
    assert not prompt_ends_in_reasoning(encode_messages(q, thinking_mode="chat"))
    assert not prompt_ends_in_reasoning(encode_messages([{**q[0], "task": "query"}], thinking_mode="thinking"))
    prefill = encode_messages(q + [{"role": "assistant", "reasoning_content": "half", "content": "", "wo_eos": True}],
                              thinking_mode="thinking")
    assert not prompt_ends_in_reasoning(prefill)   # "half</think>" is closed: the model continues the answer
    done = encode_messages(q + [{"role": "assistant", "content": "a"}], thinking_mode="thinking")
    assert not prompt_ends_in_reasoning(done)
