"""The forced tool-call grammar (dsv4.chat.tool_grammar) against the chat encoder: every call block the encoder
renders for valid arguments is accepted token by token (with the embedded model's tokenizer, through llguidance),
and blocks breaking the schema or the tool choice are refused. Then the embedded model, constrained by it, replies
with calls the chat parser reads back and that follow the schemas (checked by hand)."""
from __future__ import annotations

import json
import random

import pytest

from dsv4.chat.encoding import encode_messages
from dsv4.chat.parser import StreamingParser
from dsv4.chat.tokenizer import load_tokenizer
from dsv4.chat.tool_grammar import tool_call_grammar
from dsv4.engine.assets import default_model_path

llguidance = pytest.importorskip("llguidance")

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city"],
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer"}, "when": {"type": ["string", "null"]},
                   "opts": {"type": "object", "properties": {"scale": {"type": "array", "items": {"type": "number"}},
                                                             "fast": {"type": "boolean"}}}}}}}
NOARGS = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "y"]}}}}}  # all optional
TOOLS = [WEATHER, NOARGS, PICK]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def lltok(tok):
    return llguidance.LLTokenizer(tok.to_json(), n_vocab=tok.vocab_size, eos_token=[tok.eos_id])


def block(calls: list[tuple[str, dict]]) -> str:
    """The encoder's DSML block for `calls` (an assistant turn with these tool calls, cut out of the prompt)."""
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
                for n, a in calls]}]
    text = encode_messages(msgs, thinking_mode="chat", tools=TOOLS)
    end = "</｜DSML｜tool_calls>"
    return text[text.rindex("\n\n<｜DSML｜tool_calls>"): text.rindex(end) + len(end)]


def accepts(tok, lltok, grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    ids = tok.encode(text)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()  # accepting: EOS may follow


def random_call(rng: random.Random) -> tuple[str, dict]:
    words = ["Paris", "São Paulo", "a < b", "x/y", "<b>x</b>", "line\nbreak", "{json}", "tab\there", "\"quoted\"",
             "ünï"]
    tool = rng.choice(TOOLS)["function"]["name"]
    if tool == "now":
        return tool, {}
    if tool == "pick":
        args = {"a": rng.random() < 0.5, "b": rng.choice("xy")}
        return tool, {k: v for k, v in args.items() if rng.random() < 0.7} or {"a": True}
    args: dict = {"city": " ".join(rng.sample(words, rng.randint(1, 3)))}
    if rng.random() < 0.6:
        args["unit"] = rng.choice(["celsius", "fahrenheit"])
    if rng.random() < 0.6:
        args["days"] = rng.randint(-5, 10**6)
    if rng.random() < 0.5:
        args["when"] = rng.choice([None, "tomorrow"])
    if rng.random() < 0.5:
        args["opts"] = {"scale": [round(rng.uniform(-9, 9), 3) for _ in range(rng.randint(0, 3))],
                        "fast": rng.random() < 0.5}
    return tool, args


def test_encoder_blocks_are_accepted(tok, lltok):
    rng = random.Random()
    grammar = tool_call_grammar(TOOLS, tok.dsml_id)
    for _ in range(40):
        calls = [random_call(rng) for _ in range(rng.randint(1, 3))]
        text = block(calls)
        assert accepts(tok, lltok, grammar, text), text
        only_one = tool_call_grammar(TOOLS, tok.dsml_id, parallel=False)
        assert accepts(tok, lltok, only_one, text) == (len(calls) == 1)
        name = calls[0][0]
        named = tool_call_grammar(TOOLS, tok.dsml_id, only=name)
        assert accepts(tok, lltok, named, text) == all(n == name for n, _ in calls)


@pytest.mark.parametrize("calls, why", [
    ([("get_weather", {"unit": "celsius"})], "a required parameter missing"),
    ([("get_weather", {"city": "x", "days": "3"})], "a string where the schema wants an integer"),
    ([("get_weather", {"city": "x", "unit": "kelvin"})], "outside the enum"),
    ([("get_weather", {"city": "x", "extra": 1})], "a parameter the schema does not have"),
    ([("get_weather", {"days": 2, "city": "x"})], "parameters out of the schema's order"),
    ([("get_time", {})], "an unknown tool"),
    ([("get_weather", {"city": "a</｜DSML｜parameter>b"})], "raw text holding the closing tag (it ends the value)"),
    ([("get_weather", {"city": "x", "unit": "celsius</"})], "an enum value with more text"),
])
def test_blocks_breaking_the_schema_are_refused(tok, lltok, calls, why):
    assert not accepts(tok, lltok, tool_call_grammar(TOOLS, tok.dsml_id), block(calls)), why


@pytest.mark.parametrize("value", ["a</b", "</div>", "<", "a<", "<</", "x</x", "</", "x</", "</</", "a</b</c</d",
                                   "<p>hi</p>\n</div>\n", "if a </ b:\n    x = '</'"])
def test_raw_text_may_hold_a_closing_tag_start(tok, lltok, value):
    """A raw value ends only at "</" + the DSML token, so "</" (HTML, code) is text anywhere else in it; the parser
    reads such a block back to the same arguments."""
    args = {"city": value, "days": 3, "when": value}
    text = block([("get_weather", args), ("pick", {"b": "x"})])
    assert accepts(tok, lltok, tool_call_grammar(TOOLS, tok.dsml_id), text), text
    parser = StreamingParser("chat")
    parser.feed(text + "<｜end▁of▁sentence｜>")
    parser.finish()
    assert json.loads(parser.result()["tool_calls"][0]["function"]["arguments"]) == args


def test_a_raw_value_closes_only_after_its_lt_slash(tok, lltok):
    """While sampling a raw value the DSML token is allowed right after "</" and nowhere else; text always is."""
    text = block([("get_weather", {"city": "Q"})])
    start = text[:text.index('string="true">Q') + len('string="true">')]
    grammar = tool_call_grammar(TOOLS, tok.dsml_id)
    x = tok.encode("x")[0]
    for value, closes in [("ab", False), ("ab<", False), ("ab</", True), ("ab</x", False), ("</div></", True)]:
        m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        ids = tok.encode(start + value)
        assert m.try_consume_tokens(ids) == len(ids), value
        mask = m.compute_bitmask()
        assert [bool(mask[t // 8] >> t % 8 & 1) for t in (tok.dsml_id, x, tok.eos_id)] == [closes, True, False], value


def test_a_value_closed_without_lt_slash_is_refused(tok, lltok):
    text = block([("get_weather", {"city": "x</y"})])
    closing = "x</y</｜DSML｜parameter>"
    assert closing in text and accepts(tok, lltok, tool_call_grammar(TOOLS, tok.dsml_id), text)
    for bad in ("x</y<｜DSML｜parameter>", "x</y/｜DSML｜parameter>", "x</y｜DSML｜parameter>"):
        assert not accepts(tok, lltok, tool_call_grammar(TOOLS, tok.dsml_id), text.replace(closing, bad)), bad


def test_a_repeated_parameter_is_refused(tok, lltok):
    text = block([("get_weather", {"city": "x", "unit": "celsius"})])
    line = '<｜DSML｜parameter name="unit" string="true">celsius</｜DSML｜parameter>\n'
    assert line in text and accepts(tok, lltok, tool_call_grammar(TOOLS, tok.dsml_id), text)
    assert not accepts(tok, lltok, tool_call_grammar(TOOLS, tok.dsml_id), text.replace(line, line * 2))


def test_bad_tool_lists_are_clear_errors(tok):
    with pytest.raises(ValueError, match="no tool named 'nope'"):
        tool_call_grammar(TOOLS, tok.dsml_id, only="nope")
    with pytest.raises(ValueError, match="cannot be enforced"):
        tool_call_grammar([{"type": "function", "function": {"name": 'a"b'}}], tok.dsml_id)


def _schema_ok(name: str, args: dict) -> bool:
    if name == "now":
        return args == {}
    if name == "pick":
        return set(args) <= {"a", "b"} and isinstance(args.get("a", True), bool) and args.get("b", "x") in "xy"
    return False


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_the_model_replies_with_calls_the_parser_reads(temperature):
    """Bounded tools (the tiny model never closes free text): every reply parses into calls following the
    schemas, and a named tool is the only one called."""
    from dsv4 import LLM, SamplingParams, StructuredOutput
    llm = LLM(device="cpu")
    tools = [NOARGS, PICK]
    prompt = encode_messages([{"role": "user", "content": "What time is it? Pick one."}], thinking_mode="chat",
                             tools=tools)
    seeds = random.Random().sample(range(10**6), 3)
    for only in (None, "pick"):
        so = StructuredOutput(grammar=tool_call_grammar(tools, llm.tokenizer.dsml_id, only=only))
        outs = llm.generate([prompt] * 3, [SamplingParams(temperature=temperature, seed=s, max_tokens=150,
                                                          structured=so) for s in seeds])
        for o in outs:
            parser = StreamingParser("chat")
            parser.feed(o.text + "<｜end▁of▁sentence｜>")
            parser.finish()
            calls = parser.result()["tool_calls"]
            assert o.finish_reason == "stop" and calls, o.text
            for c in calls:
                name, args = c["function"]["name"], json.loads(c["function"]["arguments"])
                assert _schema_ok(name, args) and (only is None or name == only), o.text
