"""`dsv4 serve` on the real engine core (LLMEngine) as a process, driven by the `openai` client.

Runs on the embedded tiny model (or the checkpoint in $DSV4_TEST_SERVE_MODEL, which needs a
tokenizer.json); skipped when neither exists. A real model's text is not known in advance, so the
checks are model-independent: streamed == non-streamed under greedy and seeded sampling, usage ==
prompt lengths re-derived with encode_messages + the tokenizer, tool-call shapes, the context-length
error, auth, no leaked cache pages after concurrent and disconnected streams, clean SIGTERM exit.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

import dsv4
from dsv4.chat.encoding import encode_messages
from fake_engine import ServerProcess

KEY = "sk-real-test"
MAX_LEN = 1024


def _model_dir() -> Path | None:
    env = os.environ.get("DSV4_TEST_SERVE_MODEL")
    if env:
        return Path(env)
    embedded = Path(__file__).resolve().parents[1] / "dsv4" / "assets" / "tiny"
    return embedded if (embedded / "config.json").is_file() else None


MODEL_DIR = _model_dir()
pytestmark = pytest.mark.skipif(MODEL_DIR is None or not (MODEL_DIR / "tokenizer.json").is_file(),
                                reason="no embedded tiny model with a tokenizer (or $DSV4_TEST_SERVE_MODEL)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = ServerProcess(None, tmp_path_factory.mktemp("server") / "server.log", "--model", str(MODEL_DIR),
                        "--device", "cpu", "--numerics", "transformers", "--api-key", KEY,
                        "--max-model-len", str(MAX_LEN), "--max-num-seqs", "64", "--max-queued", "192",
                        "--retain-finished", "0", "--prefix-snapshots", "0",
                        cli=True)  # (the baseline without retention and snapshots: both on by default)
    yield srv
    rc = srv.stop(timeout=60)
    assert rc == 0 and "Traceback" not in srv.log(), srv.log()


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_name(client):
    (m,) = client.models.list().data
    return m.id


@pytest.fixture(scope="module")
def tok():
    from dsv4.chat.tokenizer import load_tokenizer
    return load_tokenizer(MODEL_DIR)


def test_auth_and_context_length(server, client, model_name, tok):
    # the startup line says how the engine runs: on the CPU eager steps over a float32 cache (the defaults resolved)
    assert re.search(r"/v1 \(cpu float32, cache auto \d+\.\d\d GiB, CUDA graphs off, overlap off\)", server.log())
    assert httpx.get(server.base_url + "/health").status_code == 200
    assert httpx.get(server.base_url + "/v1/models").status_code == 401
    assert client.models.retrieve(model_name).id == model_name  # GET /v1/models/{model}
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    version = httpx.get(server.base_url + "/version", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert version == {"version": dsv4.__version__}
    msgs = [{"role": "user", "content": "Hello"}]
    n = len(tok.encode(encode_messages(msgs, thinking_mode="chat")))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=msgs, max_tokens=MAX_LEN)
    assert re.search(rf"maximum context length is {MAX_LEN} tokens\. However, you requested {MAX_LEN + n} tokens "
                     rf"\({n} in the messages, {MAX_LEN} in the completion\)", e.value.message)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 99}])
def test_completion_stream_equals_nonstream(client, model_name, tok, sampling):
    prompt = "The help text of the print function"
    r = client.completions.create(model=model_name, prompt=prompt, max_tokens=12, **sampling)
    chunks = list(client.completions.create(model=model_name, prompt=prompt, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}, **sampling))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].usage == r.usage and r.usage.prompt_tokens == len(tok.encode(prompt))
    assert r.usage.completion_tokens == 12 or r.choices[0].finish_reason == "stop"


def _accumulate(stream):
    content, reasoning, calls, finish = "", "", {}, None
    for ch in stream:
        for c in ch.choices:
            content += c.delta.content or ""
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            for tc in c.delta.tool_calls or []:
                calls[tc.index] = (tc.function.name, tc.function.arguments)
            finish = c.finish_reason or finish
    return content, reasoning or None, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_stream_equals_nonstream(client, model_name, tok, thinking):
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "What does len do?"}]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"name": {"type": "string"}}}}}]
    tools = tools if thinking else None   # one long tools prompt is enough (CPU prefill is slow)
    kw = dict(model=model_name, messages=msgs, max_tokens=16, temperature=0, tools=tools,
              extra_body={"chat_template_kwargs": {"thinking": thinking}})
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    want_calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
    for _, args in want_calls:
        assert isinstance(json.loads(args), dict)
    got = _accumulate(client.chat.completions.create(stream=True, **kw))
    assert got == (m.content or "", getattr(m, "reasoning_content", None), want_calls, r.choices[0].finish_reason)
    prompt = encode_messages(msgs, thinking_mode="thinking" if thinking else "chat", tools=tools)
    assert r.usage.prompt_tokens == len(tok.encode(prompt))


def test_concurrent_streams_with_disconnects_leak_no_pages(server, model_name):
    async def run():
        c = AsyncOpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)

        async def one(i: int, cut: bool) -> int:
            s = await c.completions.create(model=model_name, prompt=f"Item {i}:", max_tokens=60 if cut else 6,
                                           temperature=0, stream=True)
            n = 0
            async for _ in s:
                n += 1
                if cut and n == 2:
                    break
            await s.close()
            return n

        # issue #7 acceptance: 200 concurrent streams on the real model, 50 of them cut mid-stream
        results = await asyncio.wait_for(asyncio.gather(*[one(i, i % 4 == 0) for i in range(200)],
                                                        return_exceptions=True), timeout=300)
        await c.close()
        return results

    results = asyncio.run(run())
    assert all(isinstance(r, int) and r >= 2 for r in results), results
    for _ in range(200):
        m = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
             for line in httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}
                                   ).text.splitlines() if line and not line.startswith("#")}
        if m["dsv4_num_requests_in_flight"] == 0 and m["dsv4_cache_free_pages"] == m["dsv4_cache_total_pages"]:
            break
        asyncio.run(asyncio.sleep(0.05))
    assert m["dsv4_num_requests_in_flight"] == 0
    assert m["dsv4_cache_free_pages"] == m["dsv4_cache_total_pages"] > 0


def _metric(base_url: str, name: str) -> float:
    metrics = httpx.get(base_url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return float(re.search(rf"^{name} (\S+)$", metrics, re.M).group(1))


def test_retained_conversation_and_shared_prompts_answer_as_without(server, client, model_name, tmp_path):
    """`--retain-finished`: a conversation's second turn adopts the first turn's cache (the adopted prompt tokens
    in /metrics) and answers exactly as the server without it. Prompt sharing (on by default): n = 3 choices
    compute the prompt once (the shared prompt tokens in /metrics) and answer as the prompt computed alone does.
    `--prefix-snapshots`: requests with one long system prompt answer as without, and a snapshot is kept."""
    srv = ServerProcess(None, tmp_path / "retain.log", "--model", str(MODEL_DIR), "--device", "cpu",
                        "--numerics", "transformers", "--api-key", KEY, "--max-model-len", str(MAX_LEN),
                        "--retain-finished", "4", "--prefix-snapshots", "2", cli=True)
    try:
        keeping = OpenAI(base_url=srv.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        msgs = [{"role": "user", "content": "What does the for statement do?"}]
        replies = []
        for c in (client, keeping):
            first = c.chat.completions.create(model=model_name, messages=msgs, max_tokens=12, temperature=0)
            turn2 = msgs + [{"role": "assistant", "content": first.choices[0].message.content},
                            {"role": "user", "content": "And while?"}]
            second = c.chat.completions.create(model=model_name, messages=turn2, max_tokens=12, temperature=0)
            replies.append((first.choices[0].message.content, second.choices[0].message.content))
        assert replies[0] == replies[1]
        assert _metric(srv.base_url, "dsv4_adopted_prompt_tokens") >= first.usage.prompt_tokens
        # usage.prompt_tokens_details.cached_tokens: the adopted turn-1 tokens here, none without retention
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        # thinking mode: the next turn drops the reasoning and re-renders the generation prompt's `<think>`, so the
        # cache kept is the first prompt's but its last token (retain_prefix), however long the reasoning was
        msgs, replies, think = [{"role": "system", "content": "You explain things step by step."},  # (16 tokens+)
                                {"role": "user", "content": "Why?"}], [], {"thinking": {"type": "enabled"}}
        for c in (client, keeping):
            first = c.chat.completions.create(model=model_name, messages=msgs, max_tokens=40, temperature=0,
                                              extra_body=think)
            turn2 = msgs + [{"role": "assistant", "content": "Because."}, {"role": "user", "content": "Sure?"}]
            second = c.chat.completions.create(model=model_name, messages=turn2, max_tokens=8, temperature=0,
                                               extra_body=think)
            replies.append((first.choices[0].message, second.choices[0].message.content))
        assert replies[0] == replies[1] and replies[0][0].reasoning_content
        assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
        # an agent's turns: each call comes back as text, which the tokenizer may split otherwise than the model made
        # it; the copy kept at the prompt's end (retain_prefix) still serves the next turn
        tools = [{"type": "function", "function": {"name": "pick", "parameters": {
            "type": "object", "required": ["b"],
            "properties": {"a": {"type": "boolean"}, "b": {"type": "string", "enum": ["x", "y"]}}}}}]
        calls, prompts, cached = [], [], []
        for c in (client, keeping):
            msgs = [{"role": "system", "content": "You pick things. " * 20}, {"role": "user", "content": "Pick one."}]
            for _ in range(3):
                r = c.chat.completions.create(model=model_name, messages=msgs, tools=tools, tool_choice="required",
                                              max_tokens=150, temperature=0)
                m = r.choices[0].message
                assert m.tool_calls, (r.choices[0].finish_reason, m)
                calls.append([(t.function.name, t.function.arguments) for t in m.tool_calls])
                prompts.append(r.usage.prompt_tokens)
                cached.append(r.usage.prompt_tokens_details.cached_tokens)
                msgs += [{"role": "assistant", "content": m.content,
                          "tool_calls": [t.model_dump() for t in m.tool_calls]},
                         *({"role": "tool", "tool_call_id": t.id, "content": "ok"} for t in m.tool_calls)]
        assert calls[:3] == calls[3:] and prompts[:3] == prompts[3:]
        assert cached[3] == 0 and cached[4] >= prompts[3] and cached[5] >= prompts[4]

        shared_before = _metric(server.base_url, "dsv4_shared_prompt_tokens")
        msgs = [{"role": "user", "content": "Explain what a Python generator is and when to use one."}]
        alone = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=10, temperature=0)
        three = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=10, temperature=0, n=3)
        assert [ch.message.content for ch in three.choices] == [alone.choices[0].message.content] * 3
        assert three.usage.prompt_tokens_details.cached_tokens == 0  # the prompt was computed (once)
        assert _metric(server.base_url, "dsv4_shared_prompt_tokens") - shared_before >= 2 * 16

        system = {"role": "system", "content": "You are a careful Python tutor. " * 12}
        for question in ("What is a list?", "What is a dict?", "What is a set?"):
            msgs = [system, {"role": "user", "content": question}]
            answers = [c.chat.completions.create(model=model_name, messages=msgs, max_tokens=8, temperature=0)
                       for c in (client, keeping)]
            assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
        assert answers[1].usage.prompt_tokens_details.cached_tokens >= 64  # the third copied the snapshot
        assert _metric(srv.base_url, "dsv4_prefix_snapshots") == 1
        assert _metric(srv.base_url, "dsv4_shared_prompt_tokens") >= 64
    finally:
        assert srv.stop(timeout=60) == 0 and "Traceback" not in srv.log(), srv.log()
