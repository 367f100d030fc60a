"""`POST /v1/messages` (dsv4.serve.messages, Anthropic's Messages API) through `dsv4 serve` on the embedded tiny
model, driven by the `anthropic` client.

Reference: the chat route of the same server, asked the equivalent chat request written out by hand (greedy, so the
engine's output must be the same): texts, thinking, tool calls, stop reasons and token counts must agree, and the
streamed events must rebuild the message returned whole. Errors come in the Messages API's shape and name the
offending field.
"""
from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from dsv4.serve.chat_bridge import RequestError
from dsv4.serve.messages_request import MessagesRequest, chat_messages, to_chat_request
from test_server_structured import KEY, MODEL_DIR, client, server, think_close_id  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not (MODEL_DIR / "tokenizer.json").is_file(), reason="no embedded tiny model")

PICK = {"name": "pick", "description": "Pick one.", "input_schema": {
    "type": "object", "required": ["b"], "properties": {"a": {"type": "boolean"},
                                                        "b": {"type": "string", "enum": ["x", "y"]}}}}
NOW = {"name": "now", "input_schema": {"type": "object", "properties": {}}}
GREEDY = {"temperature": 0}  # (the API has dropped temperature from its client; the server still takes it)


def as_chat_tool(tool: dict) -> dict:
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description"),
                                             "parameters": tool["input_schema"]}}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=120)


def blocks(m) -> list[tuple]:
    """(type, text / thinking / (name, input)) of each content block."""
    out = []
    for b in m.content:
        out.append((b.type, b.text if b.type == "text" else b.thinking if b.type == "thinking" else (b.name, b.input)))
    return out


def chat_blocks(c) -> list[tuple]:
    """The same of a chat completion's message."""
    m, out = c.choices[0].message, []
    if m.reasoning_content:
        out.append(("thinking", m.reasoning_content))
    if m.content:
        out.append(("text", m.content))
    for t in m.tool_calls or []:
        out.append(("tool_use", (t.function.name, json.loads(t.function.arguments))))
    return out


# ---- the translation (no server) ---------------------------------------------------------------

def test_blocks_become_chat_messages():
    """System text blocks join; a user turn's tool results come first as tool messages, then its text; an
    assistant turn's thinking, text and tool_use blocks are one message; redacted thinking is skipped."""
    req = MessagesRequest.model_validate({"max_tokens": 5, "system": [{"type": "text", "text": "A."},
                                                                      {"type": "text", "text": "B."}],
                                          "messages": [
        {"role": "user", "content": "Pick one."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Hm.", "signature": "sig"}, {"type": "redacted_thinking", "data": "z"},
            {"type": "text", "text": "Let me see."},
            {"type": "tool_use", "id": "t1", "name": "pick", "input": {"b": "x", "a": True}},
            {"type": "tool_use", "id": "t2", "name": "now", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "picked"},
            {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "noon"}]},
            {"type": "text", "text": "And?"}]}]})
    assert chat_messages(req) == [
        {"role": "system", "content": "A.\nB."},
        {"role": "user", "content": "Pick one."},
        {"role": "assistant", "content": "Let me see.", "reasoning_content": "Hm.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "pick", "arguments": '{"b": "x", "a": true}'}},
            {"id": "t2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "picked"},
        {"role": "tool", "tool_call_id": "t2", "content": "noon"},
        {"role": "user", "content": "And?"}]
    chat = to_chat_request(MessagesRequest.model_validate({
        "max_tokens": 9, "messages": [{"role": "user", "content": "x"}], "stop_sequences": ["END"],
        "tools": [PICK], "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "u7"}, "top_k": 5}))
    assert (chat.max_completion_tokens, chat.stop, chat.tool_choice, chat.parallel_tool_calls, chat.thinking.type,
            chat.user, chat.top_k) == (9, ["END"], "required", False, "enabled", "u7", 5)
    assert chat.tools[0].model_dump() == {"type": "function", "function": {
        "name": "pick", "description": "Pick one.", "parameters": PICK["input_schema"]}}


@pytest.mark.parametrize("message, words", [
    ({"role": "user", "content": [{"type": "image", "source": {}}]}, "block type 'image' is not supported"),
    ({"role": "assistant", "content": [{"type": "server_tool_use"}]}, "block type 'server_tool_use'"),
    ({"role": "system", "content": "x"}, "messages[0].role: 'system' is not one of user, assistant"),
    ({"role": "user", "content": [{"type": "tool_result", "content": "x"}]}, "needs a string 'tool_use_id'"),
    ({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]},
     "needs an object 'input'"),
    ({"role": "user", "content": 3}, "expected a string or a list of content blocks"),
    ({"role": "user", "content": ["text"]}, "content[0]: expected a content block object")])
def test_bad_blocks(message, words):
    with pytest.raises(RequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        chat_messages(MessagesRequest.model_validate({"max_tokens": 5, "messages": [message]}))


# ---- the route, against the chat route -------------------------------------------------------------

@pytest.mark.parametrize("max_tokens", [12, 60])
def test_text_answers_as_chat(claude, client, max_tokens):
    m = claude.messages.create(model="tiny", system="You are terse.", max_tokens=max_tokens, extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Name a colour."}])
    c = client.chat.completions.create(model="tiny", max_tokens=max_tokens, temperature=0, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}])
    assert blocks(m) == chat_blocks(c) and m.id.startswith("msg_") and (m.role, m.type) == ("assistant", "message")
    u = m.usage
    assert (u.input_tokens + u.cache_read_input_tokens, u.output_tokens) == (c.usage.prompt_tokens,
                                                                            c.usage.completion_tokens)
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[c.choices[0].finish_reason]


def test_thinking_comes_back_as_a_thinking_block(claude, client, think_close_id):
    bias = {str(think_close_id): 11}  # (the tiny model closes its reasoning after a few tokens)
    m = claude.messages.create(model="tiny", max_tokens=40, messages=[{"role": "user", "content": "Why?"}],
                               thinking={"type": "enabled", "budget_tokens": 1024},
                               extra_body={**GREEDY, "logit_bias": bias})
    c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Why?"}], max_tokens=40,
                                       temperature=0, logit_bias=bias, extra_body={"thinking": {"type": "enabled"}})
    got = blocks(m)
    assert [t for t, _ in got] == ["thinking", "text"] and got == chat_blocks(c)
    assert m.content[0].signature == ""


def test_forced_tool_use_and_a_conversation_with_results(claude, client, server):
    """tool_choice any / tool: tool_use blocks with the chat route's calls (arguments as the input object), stop
    reason tool_use; then a turn carrying the calls and their results renders as the chat messages do (count_tokens
    against /tokenize) and answers the same."""
    tools = [NOW, PICK]
    for choice, chat_choice in (({"type": "any"}, "required"),
                                ({"type": "tool", "name": "pick"}, {"type": "function", "function": {"name": "pick"}})):
        m = claude.messages.create(model="tiny", max_tokens=150, extra_body=GREEDY, tools=tools, tool_choice=choice,
                                   messages=[{"role": "user", "content": "What now?"}])
        c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What now?"}],
                                           tools=[as_chat_tool(t) for t in tools], tool_choice=chat_choice,
                                           max_tokens=150, temperature=0)
        assert blocks(m) == chat_blocks(c) and m.content[-1].type == "tool_use" and m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    turn = [{"role": "user", "content": "What now?"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [*({"type": "tool_result", "tool_use_id": b.id, "content": "done"}
                                           for b in uses), {"type": "text", "text": "And now?"}]}]
    chat_turn = [{"role": "user", "content": "What now?"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
                     for b in uses]},
                 *({"role": "tool", "tool_call_id": b.id, "content": "done"} for b in uses),
                 {"role": "user", "content": "And now?"}]
    chat_tools = [as_chat_tool(t) for t in tools]
    counted = claude.messages.count_tokens(model="tiny", tools=tools, messages=turn)
    tok = httpx.post(server.base_url + "/tokenize", headers={"Authorization": f"Bearer {KEY}"},
                     json={"messages": chat_turn, "tools": chat_tools}).json()
    assert counted.input_tokens == tok["count"]
    m = claude.messages.create(model="tiny", max_tokens=30, extra_body=GREEDY, tools=tools, messages=turn)
    c = client.chat.completions.create(model="tiny", messages=chat_turn, tools=chat_tools, max_tokens=30,
                                       temperature=0)
    assert blocks(m) == chat_blocks(c)


def test_a_stop_sequence_is_reported(claude, client):
    free = client.chat.completions.create(model="tiny", max_tokens=30, temperature=0,
                                          messages=[{"role": "user", "content": "Count."}]).choices[0].message.content
    stop = free[len(free) // 2: len(free) // 2 + 2]  # two characters from the middle of the free answer
    assert stop.strip(), f"precondition: a visible stop string, got {free!r}"
    m = claude.messages.create(model="tiny", max_tokens=30, extra_body=GREEDY, stop_sequences=[stop],
                               messages=[{"role": "user", "content": "Count."}])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    before = free[: free.index(stop)]
    assert blocks(m) == ([("text", before)] if before else [])


def test_output_config_effort_and_format(claude, client, think_close_id):
    """output_config.effort turns thinking on at V4's level (xhigh: max, the prompt's Think Max preamble);
    output_config.format is the chat route's json_schema response_format."""
    prompt = [{"role": "user", "content": "A number, in JSON."}]
    for effort, chat_effort in (("medium", "high"), ("xhigh", "max")):
        counted = claude.messages.count_tokens(model="tiny", messages=prompt, output_config={"effort": effort})
        c = client.chat.completions.create(model="tiny", messages=prompt, max_tokens=1, reasoning_effort=chat_effort)
        assert counted.input_tokens == c.usage.prompt_tokens
    schema = {"type": "object", "required": ["n"], "additionalProperties": False,
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}}
    m = claude.messages.create(model="tiny", max_tokens=30, messages=prompt, extra_body=GREEDY,
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    c = client.chat.completions.create(model="tiny", messages=prompt, max_tokens=30, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "num", "schema": schema}})
    assert blocks(m) == chat_blocks(c) and set(json.loads(m.content[0].text)) == {"n"}


@pytest.mark.parametrize("kind", ["plain", "thinking", "tools", "cut"])
def test_streamed_events_rebuild_the_message(claude, think_close_id, kind):
    kw = dict(model="tiny", max_tokens=40, extra_body=GREEDY, messages=[{"role": "user", "content": "Go on."}])
    if kind == "thinking":
        kw.update(thinking={"type": "enabled", "budget_tokens": 1024},
                  extra_body={**GREEDY, "logit_bias": {str(think_close_id): 11}})
    if kind == "cut":  # max_tokens ends the output inside the reasoning
        kw.update(thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=5)
    if kind == "tools":
        kw.update(tools=[PICK], tool_choice={"type": "any"}, max_tokens=150)
    whole = claude.messages.create(**kw)
    events = list(claude.messages.create(stream=True, **kw))
    assert events[0].type == "message_start" and events[0].message.content == []
    assert [e.type for e in events[-2:]] == ["message_delta", "message_stop"]
    assert (events[-2].delta.stop_reason, events[-2].usage.output_tokens) == (whole.stop_reason,
                                                                             whole.usage.output_tokens)
    # each block: a start, deltas that add up to its content, a stop; blocks in order
    rebuilt, order = {}, []
    for e in events[1:-2]:
        if e.type == "content_block_start":
            order.append(("start", e.index))
            rebuilt[e.index] = ""
        elif e.type == "content_block_delta":
            d = e.delta
            rebuilt[e.index] += d.text if d.type == "text_delta" else d.thinking if d.type == "thinking_delta" \
                else d.partial_json
        else:
            assert e.type == "content_block_stop"
            order.append(("stop", e.index))
    assert order == [(s, i) for i in range(len(whole.content)) for s in ("start", "stop")]
    for i, b in enumerate(whole.content):
        assert rebuilt[i] == (b.text if b.type == "text" else b.thinking if b.type == "thinking"
                              else json.dumps(b.input))
    with claude.messages.stream(**kw) as stream:  # the SDK's own accumulation of the events
        final = stream.get_final_message()
    assert blocks(final) == blocks(whole) and final.stop_reason == whole.stop_reason
    if kind == "cut":
        assert whole.stop_reason == "max_tokens" and [b.type for b in whole.content] == ["thinking"]


@pytest.mark.parametrize("body, status, kind, words", [
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error", "max_tokens: Field required"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
     "invalid_request_error", "block type 'image'"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "w", "type": "web_search"}]},
     400, "invalid_request_error", "'web_search' is not supported"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"},
      "tools": [NOW]}, 400, "invalid_request_error", "needs the tool's name"),
    ({"max_tokens": 5000, "messages": [{"role": "user", "content": "x"}]}, 400, "invalid_request_error",
     "maximum context length"),
    ({"max_tokens": 5, "model": "claude-x", "messages": [{"role": "user", "content": "x"}]}, 404, "not_found_error",
     "does not exist")])
def test_errors_have_the_messages_shape(server, body, status, kind, words):
    r = httpx.post(server.base_url + "/v1/messages", headers={"x-api-key": KEY}, json=body)
    got = r.json()
    assert r.status_code == status and got["type"] == "error" and got["error"]["type"] == kind, got
    assert words in got["error"]["message"], got


def test_the_api_key_header_and_a_missing_key(server):
    """The SDK's x-api-key is a key like Authorization: Bearer; without one, a 401 in the route's shape."""
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    assert httpx.post(server.base_url + "/v1/messages", headers={"x-api-key": KEY}, json=body).status_code == 200
    assert httpx.post(server.base_url + "/v1/messages/count_tokens", headers={"Authorization": f"Bearer {KEY}"},
                      json=body).status_code == 200
    for headers in ({}, {"x-api-key": "wrong"}):
        r = httpx.post(server.base_url + "/v1/messages", headers=headers, json=body)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(server.base_url + "/v1/chat/completions", headers={"x-api-key": "wrong"}, json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"  # (OpenAI's shape there)
