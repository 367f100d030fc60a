"""Structured outputs through `dsv4 serve` on the embedded tiny model, driven by the `openai` client: chat's
`response_format` (json_object, json_schema), the `structured_outputs` extension on both endpoints, the thinking
mode (the grammar starts after the reasoning block), streaming, tool_choice "required" / a named function as a
grammar of DSML calls, and the 400s for bad grammars.

The replies are checked with Python's json / re, not with the grammar engine the server uses.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI

from fake_engine import ServerProcess

KEY = "sk-structured-test"
MODEL_DIR = Path(__file__).resolve().parents[1] / "dsv4" / "assets" / "tiny"
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "days", "sunny"],
          "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1,
                                                                             "maximum": 14},
                         "sunny": {"type": "boolean"}}}
pytestmark = pytest.mark.skipif(not (MODEL_DIR / "tokenizer.json").is_file(), reason="no embedded tiny model")


def schema_ok(text: str) -> bool:
    v = json.loads(text)
    return (set(v) == {"city", "days", "sunny"} and isinstance(v["city"], str) and len(v["city"]) <= 10
            and type(v["days"]) is int and 1 <= v["days"] <= 14 and isinstance(v["sunny"], bool))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(None, tmp_path_factory.mktemp("server") / "server.log", "--model", str(MODEL_DIR),
                        "--device", "cpu", "--api-key", KEY, "--max-model-len", "1024", cli=True)
    yield srv
    assert srv.stop(timeout=60) == 0 and "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def think_close_id():
    from dsv4.chat.tokenizer import load_tokenizer
    return load_tokenizer(MODEL_DIR).think_close_id


MSGS = [{"role": "user", "content": "Plan a trip. Reply in JSON."}]


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_chat_json_schema_and_object(client, temperature):
    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=60, temperature=temperature,
                                       seed=7, n=2, response_format=fmt)
    for ch in r.choices:
        assert ch.finish_reason == "stop" and schema_ok(ch.message.content), ch
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=120, temperature=temperature,
                                       seed=11, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":  # an object the model may keep extending past max_tokens
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_streamed_equals_whole_and_thinking_answers_in_the_format(client, think_close_id):
    kw = dict(model="tiny", messages=MSGS, max_tokens=60, temperature=0,
              response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                       if c.choices)
    assert streamed == whole and schema_ok(whole)
    # thinking: the reasoning is free; a bias makes the tiny model close it at once, then the answer is the JSON
    r = client.chat.completions.create(**kw, logit_bias={str(think_close_id): 100},
                                       extra_body={"chat_template_kwargs": {"thinking": True}})
    m = r.choices[0].message
    assert not getattr(m, "reasoning_content", None) and schema_ok(m.content), m


def test_completions_structured_outputs(client):
    regex = r"[A-Z][a-z]{2,5} [0-9]{1,2}"
    r = client.completions.create(model="tiny", prompt=["Date:", "When?"], max_tokens=20, temperature=1.0,
                                  seed=3, n=2, extra_body={"structured_outputs": {"regex": regex}})
    assert len(r.choices) == 4
    for ch in r.choices:
        assert ch.finish_reason == "stop" and re.fullmatch(regex, ch.text), ch.text
    r = client.completions.create(model="tiny", prompt="Is it?", max_tokens=10, temperature=0,
                                  extra_body={"structured_outputs": {"choice": ["yes", "no", "perhaps"]}})
    assert r.choices[0].text in ("yes", "no", "perhaps")
    lark = 'start: "(" num ("," num)* ")"\nnum: /[0-9]{1,3}/'
    r = client.completions.create(model="tiny", prompt="A tuple:", max_tokens=40, temperature=1.0, seed=5,
                                  extra_body={"structured_outputs": {"grammar": lark}})
    if r.choices[0].finish_reason == "stop":
        assert re.fullmatch(r"\([0-9]{1,3}(,[0-9]{1,3})*\)", r.choices[0].text), r.choices[0].text


TOOLS = [{"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
         {"type": "function", "function": {"name": "pick", "parameters": {
             "type": "object", "required": ["b"], "properties": {"a": {"type": "boolean"},
                                                                 "b": {"type": "string", "enum": ["x", "y"]}}}}}]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "pick"}}])
def test_forced_tool_choice(client, choice):
    """tool_choice "required" / a named function: the reply is tool calls (of that function), streamed alike;
    parallel_tool_calls false: exactly one."""
    kw = dict(model="tiny", messages=[{"role": "user", "content": "What time is it?"}], tools=TOOLS,
              tool_choice=choice, max_tokens=150, temperature=0)
    r = client.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls, ch
    for c in ch.message.tool_calls:
        args = json.loads(c.function.arguments)
        assert c.function.name in ("now", "pick") and (choice == "required" or c.function.name == "pick")
        assert args == {} if c.function.name == "now" else (args["b"] in ("x", "y") and set(args) <= {"a", "b"})
    streamed = {}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed[tc.index] = (tc.function.name, tc.function.arguments)
    assert [streamed[i] for i in sorted(streamed)] == [(c.function.name, c.function.arguments)
                                                       for c in ch.message.tool_calls]
    one = client.chat.completions.create(**kw, parallel_tool_calls=False, seed=1)
    assert len(one.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("path, body, words", [
    ("/v1/chat/completions", {"messages": MSGS, "response_format": {"type": "json_object"},
                              "structured_outputs": {"regex": "a"}}, "not both"),
    ("/v1/chat/completions", {"messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, "structured output json"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "(unclosed"}}, "structured output regex"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"grammar": "start: nothing_here"}}, "grammar"),
    ("/v1/chat/completions", {"messages": MSGS, "tools": TOOLS, "tool_choice": "required",
                              "response_format": {"type": "json_object"}}, "not both"),
])
def test_bad_grammars_get_400(server, path, body, words):
    r = httpx.post(server.base_url + path, headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "tiny", "max_tokens": 4, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]


def test_openai_client_sees_the_400(client):
    with pytest.raises(openai.BadRequestError, match="structured output regex"):
        client.completions.create(model="tiny", prompt="x", max_tokens=4,
                                  extra_body={"structured_outputs": {"regex": "[z-a]"}})


def test_metrics_count_structured_requests(server, client):
    """/metrics counts admitted sequences per grammar kind (n choices count n times)."""
    def count(kind: str) -> float:
        text = httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        m = re.search(rf'^dsv4_structured_requests_total{{kind="{kind}"}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    before = count("choice"), count("json_object")
    client.completions.create(model="tiny", prompt="Is it?", max_tokens=6, n=2,
                              extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4, response_format={"type": "json_object"})
    assert (count("choice"), count("json_object")) == (before[0] + 2, before[1] + 1)
