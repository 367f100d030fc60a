"""`POST /v1/responses` (dsv4.serve.responses) through `dsv4 serve` on the embedded tiny model, driven by the openai
client's Responses API.

Reference: the chat route of the same server, asked the equivalent chat request written out by hand (greedy, so the
engine's output must be the same): texts, reasoning, tool calls, logprobs and token counts must agree, and the
streamed events must rebuild the response returned whole. The 400s name the offending field.
"""
from __future__ import annotations

import json

import httpx
import pytest

from dsv4.serve.chat_bridge import RequestError
from dsv4.serve.response_store import ResponseStore
from dsv4.serve.responses_request import ResponsesRequest, input_messages, to_chat_request
from test_server_structured import KEY, MODEL_DIR, client, server, think_close_id  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not (MODEL_DIR / "tokenizer.json").is_file(), reason="no embedded tiny model")

FN = {"name": "pick", "description": "Pick one.", "parameters": {
    "type": "object", "required": ["b"], "properties": {"a": {"type": "boolean"},
                                                        "b": {"type": "string", "enum": ["x", "y"]}}}}
NOW = {"name": "now", "parameters": {"type": "object", "properties": {}}}


def texts(r) -> list[tuple]:
    """(type, text or (name, arguments)) of each output item."""
    out = []
    for item in r.output:
        if item.type == "function_call":
            out.append((item.type, (item.name, item.arguments)))
        else:
            out.append((item.type, "".join(c.text for c in item.content)))
    return out


# ---- the translation (no server) ---------------------------------------------------------------

def test_input_items_become_chat_messages():
    """An assistant turn (reasoning, message, two calls) is one assistant message; outputs are tool messages; the
    instructions come first; text parts are joined."""
    req = ResponsesRequest.model_validate({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
        {"type": "function_call", "call_id": "c1", "name": "pick", "arguments": '{"b": "x"}'},
        {"type": "function_call", "call_id": "c2", "name": "now", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "picked"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
        {"role": "developer", "content": "d"},
        {"type": "function_call", "call_id": "c3", "name": "now", "arguments": "{}"}]})
    assert input_messages(req) == [
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "Let me see.", "reasoning_content": "hm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "pick", "arguments": '{"b": "x"}'}},
            {"id": "c2", "type": "function", "function": {"name": "now", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "picked"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        {"role": "developer", "content": "d"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}]
    # instructions first, then a stored conversation's messages, then the input's
    history = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"}]
    req = ResponsesRequest.model_validate({"instructions": "Be brief.", "input": "now"})
    assert [m.model_dump(exclude_none=True) for m in to_chat_request(req, history).messages] == [
        {"role": "system", "content": "Be brief."}, *history, {"role": "user", "content": "now"}]


def test_the_store_keeps_turns_and_forgets_the_least_recently_used():
    """Each stored response holds its own turn; a history is the chain of turns; eviction by count and by text."""
    store = ResponseStore(3)
    for i in range(3):
        store.put(f"r{i}", f"r{i - 1}" if i else None, [{"role": "user", "content": f"u{i}"}], {"id": f"r{i}"})
    assert [m["content"] for m in store.history("r2")] == ["u0", "u1", "u2"]
    store.put("x", None, [{"role": "user", "content": "x"}], {"id": "x"})  # history("r2") used r0 first: it goes
    assert store.get("r0") is None and store.get("r1") == {"id": "r1"}
    with pytest.raises(RequestError, match="'r2' is not stored \\(it continues 'r0', which is not\\)"):
        store.history("r2")
    assert store.delete("x") and not store.delete("x") and len(store) == 2
    turn = [{"role": "user", "content": "y" * 30}]
    small = ResponseStore(10, max_chars=2 * len(json.dumps(turn)) + 1)  # two turns' text
    for i in range(5):
        small.put(f"s{i}", None, turn, {"id": i})
    assert len(small) == 2 and small.chars <= small.max_chars and small.get("s4") == {"id": 4}


@pytest.mark.parametrize("item, words", [
    ({"type": "input_image", "image_url": "x"}, "item type 'input_image'"),
    ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}, "content[0]: content part type"),
    ({"role": "tool", "content": "x"}, "input[0].role"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "needs a string 'call_id'"),
    ({"type": "function_call_output", "call_id": "c", "output": 3}, "content: expected a string"),
    ("text", "input[0]: expected an object")])
def test_bad_input_items(item, words):
    with pytest.raises(RequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        input_messages(ResponsesRequest.model_validate({"input": [item]}))


# ---- the route, against the chat route -------------------------------------------------------------

@pytest.mark.parametrize("max_tokens", [12, 60])
def test_text_input_answers_as_chat(client, max_tokens):
    r = client.responses.create(model="tiny", instructions="You are terse.", input="Name a colour.",
                                max_output_tokens=max_tokens, temperature=0, extra_body={"priority": -3})
    c = client.chat.completions.create(model="tiny", max_tokens=max_tokens, temperature=0, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}])
    assert texts(r) == [("message", c.choices[0].message.content)]
    assert r.output_text == c.choices[0].message.content
    u = r.usage
    assert (u.input_tokens, u.output_tokens, u.total_tokens) == (c.usage.prompt_tokens, c.usage.completion_tokens,
                                                                  c.usage.total_tokens)
    assert u.output_tokens_details.reasoning_tokens == 0
    if c.choices[0].finish_reason == "length":
        assert (r.status, r.incomplete_details.reason, r.output[0].status) == ("incomplete", "max_output_tokens",
                                                                             "incomplete")
    else:
        assert (r.status, r.incomplete_details, r.output[0].status) == ("completed", None, "completed")
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_") and r.store is True


def test_a_conversation_with_calls_renders_as_chat(client, server):
    """Items with an earlier turn's reasoning, calls and their outputs: the same prompt as the chat messages (the
    tokens /tokenize gives for them), the same answer."""
    items = [{"role": "user", "content": "Pick one."},
             {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Think."}]},
             {"type": "function_call", "call_id": "call_1", "name": "pick", "arguments": '{"b": "y"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "done"},
             {"role": "user", "content": [{"type": "input_text", "text": "And now?"}]}]
    messages = [{"role": "user", "content": "Pick one."},
                {"role": "assistant", "content": None, "reasoning_content": "Think.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "pick", "arguments": '{"b": "y"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "done"},
                {"role": "user", "content": "And now?"}]
    r = client.responses.create(model="tiny", input=items, tools=[{"type": "function", **FN}], max_output_tokens=30,
                                temperature=0)
    chat_tools = [{"type": "function", "function": FN}]
    c = client.chat.completions.create(model="tiny", messages=messages, tools=chat_tools, max_tokens=30,
                                       temperature=0)
    tok = httpx.post(server.base_url + "/tokenize", headers={"Authorization": f"Bearer {KEY}"},
                     json={"messages": messages, "tools": chat_tools}).json()
    assert r.usage.input_tokens == c.usage.prompt_tokens == tok["count"]
    assert r.output_text == c.choices[0].message.content


def test_reasoning_comes_back_as_a_reasoning_item(client, think_close_id):
    """Thinking (reasoning.effort): the reasoning is a reasoning item, the answer a message, as chat's
    reasoning_content / content; reasoning_tokens counts the generated tokens up to the block's closing token."""
    bias = {str(think_close_id): 11}  # (the tiny model closes its reasoning after a few tokens)
    r = client.responses.create(model="tiny", input="Why?", reasoning={"effort": "high"}, max_output_tokens=40,
                                temperature=0, extra_body={"logit_bias": bias})
    c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Why?"}],
                                       reasoning_effort="high", max_tokens=40, temperature=0, logit_bias=bias,
                                       logprobs=True)
    m = c.choices[0].message
    assert m.reasoning_content and m.content  # both parts are there to compare
    assert texts(r) == [("reasoning", m.reasoning_content), ("message", m.content)]
    tokens = [t.token for t in c.choices[0].logprobs.content]
    assert r.usage.output_tokens_details.reasoning_tokens == tokens.index("</think>") + 1
    assert r.output[0].id.startswith("rs_")


def test_forced_calls_and_a_json_schema(client):
    """tool_choice "required" / a named function in the Responses shape, and text.format json_schema: the chat
    route's tool calls and JSON."""
    for choice, chat_choice in (("required", "required"), ({"type": "function", "name": "pick"},
                                                           {"type": "function", "function": {"name": "pick"}})):
        r = client.responses.create(model="tiny", input="What now?", tools=[{"type": "function", **NOW},
                                                                             {"type": "function", **FN}],
                                    tool_choice=choice, max_output_tokens=150, temperature=0)
        c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "What now?"}],
                                           tools=[{"type": "function", "function": NOW},
                                                  {"type": "function", "function": FN}],
                                           tool_choice=chat_choice, max_tokens=150, temperature=0)
        calls = [("function_call", (t.function.name, t.function.arguments)) for t in c.choices[0].message.tool_calls]
        assert calls and texts(r) == calls
        assert all(item.call_id.startswith("call_") and item.status == "completed" for item in r.output)
    schema = {"type": "object", "required": ["n"], "additionalProperties": False,
              "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}}
    r = client.responses.create(model="tiny", input="A number, in JSON.", max_output_tokens=30, temperature=0,
                                text={"format": {"type": "json_schema", "name": "num", "schema": schema}})
    c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "A number, in JSON."}],
                                       max_tokens=30, temperature=0, response_format={
                                           "type": "json_schema", "json_schema": {"name": "num", "schema": schema}})
    assert r.output_text == c.choices[0].message.content and set(json.loads(r.output_text)) == {"n"}
    assert r.text.format.type == "json_schema"


def test_logprobs_of_the_answer(client):
    r = client.responses.create(model="tiny", input="Count.", max_output_tokens=8, temperature=0, top_logprobs=2,
                                include=["message.output_text.logprobs"])
    c = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Count."}], max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=2)
    got = [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in r.output[0].content[0].logprobs]
    want = [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in c.choices[0].logprobs.content]
    assert got == want and len(got) == 8


@pytest.mark.parametrize("kind", ["plain", "thinking", "tools", "cut"])
def test_streamed_events_rebuild_the_response(client, think_close_id, kind):
    kw = dict(model="tiny", input="Go on.", max_output_tokens=40, temperature=0)
    if kind == "thinking":
        kw.update(reasoning={"effort": "high"}, extra_body={"logit_bias": {str(think_close_id): 11}})
    if kind == "cut":  # max_output_tokens ends the output inside the reasoning: that item is incomplete
        kw.update(reasoning={"effort": "high"}, max_output_tokens=5)
    if kind == "tools":
        kw.update(tools=[{"type": "function", **FN}], tool_choice="required", max_output_tokens=150)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1]
    assert final.type == f"response.{whole.status}" and final.response.status == whole.status
    assert texts(final.response) == texts(whole)
    # (the cached tokens differ: the second request of one prompt forks the first one's retained copy)
    assert final.response.usage.model_dump(exclude={"input_tokens_details"}) == \
        whole.usage.model_dump(exclude={"input_tokens_details"})
    assert [i.status for i in final.response.output] == [i.status for i in whole.output]
    # the deltas of each item add up to its text; every item is announced, then done, in order
    rebuilt: dict[int, str] = {}
    added, done = [], []
    for e in events[2:-1]:
        if e.type in ("response.output_text.delta", "response.reasoning_text.delta",
                      "response.function_call_arguments.delta"):
            rebuilt[e.output_index] = rebuilt.get(e.output_index, "") + e.delta
        elif e.type == "response.output_item.added":
            added.append(e.output_index)
        elif e.type == "response.output_item.done":
            done.append(e.output_index)
            item = e.item
            want = (item.arguments if item.type == "function_call" else "".join(c.text for c in item.content))
            assert rebuilt.get(e.output_index, "") == want
            assert (item.id, item.status) == (final.response.output[e.output_index].id,
                                              final.response.output[e.output_index].status)
    assert added == done == list(range(len(whole.output)))
    assert len(rebuilt) >= 1
    if kind == "cut":
        assert whole.status == "incomplete" and [(i.type, i.status) for i in whole.output] == [
            ("reasoning", "incomplete")]


@pytest.mark.parametrize("body, param, words", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "'resp_1' is not stored"),
    ({"input": "x", "conversation": "conv_1"}, "conversation", "stores no conversations"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "'web_search' is not supported"),
    ({"input": "x", "tool_choice": {"type": "web_search"}, "tools": [{"type": "function", **NOW}]}, "tool_choice",
     "not supported"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice", "needs a non-empty tools list"),
    ({"input": "x", "background": True}, "background", "not supported"),
    ({"input": "x", "truncation": "auto"}, "truncation", "not supported"),
    ({"input": "x", "n": 2}, "n", "one output per response"),
    ({"input": []}, "input", "input is empty"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input", "'item_reference' is not supported"),
    ({"input": "x", "max_output_tokens": 5000}, "input", "maximum context length"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}, "text", "needs a schema"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": 3}}}}, None,
     "structured output json: type must be"),
    ({"input": "x", "text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a"}}, "text",
     "not both"),
    ({"input": "x", "priority": "high"}, "priority", "valid integer"),
    ({"input": "x", "model": "other"}, "model", "does not exist")])
def test_errors_name_the_field(server, body, param, words):
    r = httpx.post(server.base_url + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"}, json=body)
    err = r.json()["error"]
    assert r.status_code == (404 if param == "model" else 400) and err["param"] == param, err
    assert words in err["message"], err


def test_previous_response_id_continues_the_conversation(client, server):
    """Turn 1 (a forced call), then turn 2 by previous_response_id with the call's output: the same prompt and answer
    as a stateless request carrying turn 1's input and output items; GET returns a stored response, DELETE forgets
    it; store: false keeps nothing."""
    tools = [{"type": "function", **NOW}]
    first = client.responses.create(model="tiny", input="What time is it?", tools=tools, tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    call = next(item for item in first.output if item.type == "function_call")
    follow = [{"type": "function_call_output", "call_id": call.call_id, "output": "noon"}]
    kw = dict(model="tiny", tools=tools, max_output_tokens=20, temperature=0)
    chained = client.responses.create(previous_response_id=first.id, input=follow, **kw)
    whole = client.responses.create(input=[{"role": "user", "content": "What time is it?"},
                                           *[item.model_dump(exclude_none=True) for item in first.output], *follow],
                                    store=False, **kw)
    assert chained.usage.input_tokens == whole.usage.input_tokens > first.usage.input_tokens
    assert texts(chained) == texts(whole) and chained.previous_response_id == first.id
    headers = {"Authorization": f"Bearer {KEY}"}
    got = httpx.get(f"{server.base_url}/v1/responses/{first.id}", headers=headers)
    body = got.json()
    assert got.status_code == 200 and body["id"] == first.id and body["status"] == first.status
    assert [i["id"] for i in body["output"]] == [i.id for i in first.output]
    assert body["usage"] == first.usage.model_dump(exclude_none=True)
    assert httpx.get(f"{server.base_url}/v1/responses/{whole.id}", headers=headers).status_code == 404
    assert whole.store is False and chained.store is True
    assert httpx.delete(f"{server.base_url}/v1/responses/{first.id}", headers=headers).json()["deleted"] is True
    assert httpx.get(f"{server.base_url}/v1/responses/{first.id}", headers=headers).status_code == 404
    r = httpx.post(server.base_url + "/v1/responses", headers=headers,
                   json={"input": "and?", "previous_response_id": chained.id})
    assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
    assert f"it continues {first.id!r}, which is not" in r.json()["error"]["message"]
