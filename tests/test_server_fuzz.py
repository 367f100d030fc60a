"""Fuzzed request bodies against a real server process: never a 500, always the route's error shape (OpenAI's;
the Messages API's on /v1/messages).

Bodies are drawn by hypothesis from the fields the server itself publishes in /openapi.json: a valid
base request with any subset of fields replaced by arbitrary JSON (wrong types, huge and negative
numbers, NaN, nested junk), random extra fields, arbitrary JSON documents and raw bytes. Valid
draws really generate (streamed or not), so the engine path is fuzzed too.
"""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fake_engine import ServerProcess, write_tokenizer

ROUTES = {"/v1/completions": ("CompletionRequest", {"prompt": "count"}),
          "/v1/chat/completions": ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "hi"}]}),
          "/v1/responses": ("ResponsesRequest", {"input": "hi"}),
          "/v1/messages": ("MessagesRequest", {"messages": [{"role": "user", "content": "hi"}]})}
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(d)
    srv = ServerProcess(d, tmp_path_factory.mktemp("server") / "server.log", "--max-model-len", "192",
                        "--max-num-seqs", "16", "--max-body-bytes", "20000")
    yield srv
    rc = srv.stop()
    log = srv.log()
    assert rc == 0 and "Traceback" not in log and "internal error" not in log, log


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def fields(http):
    """Request fields per route, from the served OpenAPI schema."""
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    out = {path: sorted(schemas[name]["properties"]) for path, (name, _) in ROUTES.items()}
    assert {"prompt", "max_tokens", "stop", "logprobs", "n"} <= set(out["/v1/completions"])
    assert {"messages", "tools", "tool_choice", "chat_template_kwargs"} <= set(out["/v1/chat/completions"])
    assert {"input", "instructions", "tools", "text", "reasoning"} <= set(out["/v1/responses"])
    assert {"messages", "system", "tools", "tool_choice", "thinking", "stop_sequences"} <= set(out["/v1/messages"])
    return out


scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.sampled_from([0, 1, -1, 2, 8, 9, 20, 21, 255, 2**63])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30)
           | st.text(st.characters(exclude_categories=()), max_size=8)   # NUL, controls
           | st.sampled_from(["auto", "none", "required", "high", "max", "function", "user", "tool", "text"]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.sampled_from(["role", "content", "type", "function", "name",
                                                              "arguments", "text", "thinking", "include_usage"])
                                             | st.text(max_size=8), inner, max_size=4), max_leaves=10)
# Any code point, lone surrogates included (st.text never yields those, so build strings by hand).
edge_text = st.lists(st.characters(exclude_categories=()) | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                     min_size=1, max_size=8).map("".join)
TEXT_SLOTS = {"/v1/completions": [lambda t: {"prompt": t}, lambda t: {"stop": [t]}, lambda t: {"prompt": [t, "x"]}],
              "/v1/chat/completions": [lambda t: {"messages": [{"role": "user", "content": t}]},
                                       lambda t: {"messages": [{"role": "system", "content": t},
                                                               {"role": "user", "content": "x"}]},
                                       lambda t: {"stop": t}],
              "/v1/responses": [lambda t: {"input": t}, lambda t: {"instructions": t},
                                lambda t: {"input": [{"role": "user", "content": [{"type": "input_text", "text": t}]}]},
                                lambda t: {"input": [{"type": "function_call", "call_id": t, "name": t,
                                                      "arguments": t}]}],
              "/v1/messages": [lambda t: {"system": t}, lambda t: {"stop_sequences": [t]},
                               lambda t: {"messages": [{"role": "user", "content": [{"type": "text", "text": t}]}]},
                               lambda t: {"messages": [{"role": "user", "content": "x"}, {
                                   "role": "assistant",
                                   "content": [{"type": "tool_use", "id": t, "name": t, "input": {t: t}}]}]}]}
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"])},
    optional={"content": st.text(max_size=40) | json_values, "tool_calls": json_values,
              "reasoning_content": st.text(max_size=20), "tool_call_id": st.text(max_size=8)}), max_size=4)


items = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["message", "reasoning", "function_call", "function_call_output"])},
    optional={"role": st.sampled_from(["system", "user", "assistant", "developer"]),
              "content": st.text(max_size=40) | json_values, "call_id": st.text(max_size=8),
              "name": st.text(max_size=8), "arguments": st.text(max_size=20), "output": st.text(max_size=20)}),
    max_size=4)


blocks = st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "thinking", "tool_use", "tool_result", "image", "redacted_thinking"])},
    optional={"text": st.text(max_size=20) | json_values, "thinking": st.text(max_size=20), "id": st.text(max_size=8),
              "name": st.text(max_size=8), "input": json_values, "tool_use_id": st.text(max_size=8),
              "content": st.text(max_size=20) | json_values}), max_size=4)
turns = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"])},
                                       optional={"content": st.text(max_size=40) | blocks | json_values}), max_size=4)


def check(r: httpx.Response, stream: bool, path: str = "") -> None:
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        body = r.json()
        if path == "/v1/messages":
            assert body["type"] == "error"
        err = body["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
        return
    if path == "/v1/messages":  # (named events; no [DONE])
        if stream:
            kinds = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "error" not in kinds, kinds
        else:
            assert r.json()["type"] == "message" and r.json()["stop_reason"]
        return
    if path == "/v1/responses":  # (its events end with the whole response, no [DONE])
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")] if stream \
            else [{"type": "response.completed", "response": r.json()}]
        assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]
        assert events[-1]["response"]["output"] and not any("error" in e for e in events)
        return
    if stream:
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        for e in events[:-1]:
            assert "error" not in json.loads(e), e
    else:
        assert r.json()["choices"]


def post(http, path: str, body) -> int:
    stream = isinstance(body, dict) and body.get("stream") is True
    r = http.post(path, content=json.dumps(body, allow_nan=True), headers={"content-type": "application/json"})
    check(r, stream, path)
    return r.status_code


@pytest.mark.parametrize("path", list(ROUTES))
def test_mutated_valid_bodies_never_500(http, fields, path):
    statuses = []

    @FUZZ
    @given(data=st.data())
    def run(data):
        body = dict(ROUTES[path][1], model="dsv4-fake", max_tokens=data.draw(st.integers(1, 12)))
        names = data.draw(st.lists(st.sampled_from(fields[path]), max_size=4, unique=True))
        for name in names:
            if name == "messages":
                body[name] = data.draw((turns if path == "/v1/messages" else messages) | json_values)
            elif name == "input":
                body[name] = data.draw(items | json_values)
            else:
                body[name] = data.draw(json_values)
        if data.draw(st.booleans()):
            body.pop(data.draw(st.sampled_from(sorted(body))))
        body.update(data.draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2)))
        if data.draw(st.booleans()):   # any Unicode (lone surrogates, NUL, controls) in a text field
            body.update(data.draw(st.sampled_from(TEXT_SLOTS[path]))(data.draw(edge_text)))
        statuses.append(post(http, path, body))
    run()
    assert statuses.count(200) >= len(statuses) // 10, statuses   # the engine path is fuzzed too


@pytest.mark.parametrize("path", list(ROUTES))
def test_arbitrary_json_and_bytes_never_500(http, path):
    @FUZZ
    @given(body=json_values | st.dictionaries(st.text(max_size=10), json_values, max_size=6),
           raw=st.binary(max_size=64))
    def run(body, raw):
        post(http, path, body)
        r = http.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
    run()


def test_valid_sampling_fields_generate(http):
    """In-range sampling fields always produce a completion (the engine validates nothing the app let through)."""
    @settings(max_examples=30, deadline=None, derandomize=True, database=None)
    @given(temperature=st.floats(0, 2), top_p=st.floats(0.01, 1), top_k=st.integers(-1, 50), min_p=st.floats(0, 1),
           presence=st.floats(-2, 2), frequency=st.floats(-2, 2), repetition=st.floats(0.1, 10),
           seed=st.integers(-(2**63), 2**64 - 1) | st.none(), n=st.integers(1, 3), stream=st.booleans(),
           stop=st.lists(st.text(min_size=1, max_size=5), max_size=3), logprobs=st.integers(0, 20) | st.none())
    def run(temperature, top_p, top_k, min_p, presence, frequency, repetition, seed, n, stream, stop, logprobs):
        body = {"prompt": "count", "max_tokens": 6, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                "min_p": min_p, "presence_penalty": presence, "frequency_penalty": frequency,
                "repetition_penalty": repetition, "seed": seed, "n": n, "stream": stream, "stop": stop,
                "logprobs": logprobs}
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        check(r, stream)
    run()


def test_structured_outputs_never_500(http):
    """Arbitrary regexes, Lark texts, JSON schemas and choices: a reply in the format or a 400, never a 500."""
    regex_text = st.text(st.sampled_from("ab09()[]{}|*+?.^$\\-,:\"'/ "), max_size=16)
    kinds = (st.builds(lambda v: {"regex": v}, regex_text | st.text(max_size=12))
             | st.builds(lambda v: {"grammar": v}, regex_text.map(lambda t: "start: " + t) | st.text(max_size=20))
             | st.builds(lambda v: {"json": v}, json_values | st.dictionaries(
                 st.sampled_from(["type", "properties", "required", "enum", "items", "pattern", "maxLength",
                                  "minimum", "anyOf", "$ref", "const"]), json_values, max_size=4))
             | st.builds(lambda v: {"choice": v}, json_values | st.lists(st.text(max_size=6), max_size=3)))
    statuses = []

    @FUZZ
    @given(so=kinds, stream=st.booleans(), chat=st.booleans())
    def run(so, stream, chat):
        path, base = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}) if chat \
            else ("/v1/completions", {"prompt": "count"})
        statuses.append(post(http, path, {**base, "max_tokens": 8, "stream": stream, "structured_outputs": so}))
    run()
    assert statuses.count(200) >= len(statuses) // 10 and statuses.count(400) >= len(statuses) // 10, statuses
