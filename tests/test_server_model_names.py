"""`dsv4 serve --served-model-name A B C`: every name is a model id clients may send (the OpenAI and Anthropic
clients), `/v1/models` lists them all, and each reply names the id its request sent (the first name when it sent
none); an unknown id is a 404 on every generation route; empty or repeated names are refused at startup. On the
fake engine core (fake_engine.py). Also a serve default that depends on another option (`--prefix-snapshots`)."""
from __future__ import annotations

import argparse

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from fake_engine import ServerProcess, write_tokenizer

KEY = "sk-names"
NAMES = ["deepseek-v4-flash", "dsv4", "deepseek-chat"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(d)
    srv = ServerProcess(d, tmp_path_factory.mktemp("logs") / "names.log", "--api-key", KEY,
                        "--served-model-name", *NAMES)
    yield srv
    assert srv.stop() == 0 and "Traceback" not in srv.log(), srv.log()


def test_every_name_is_listed_and_answers_under_its_own_id(server):
    client = OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list().data] == NAMES
    claude = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)
    for name in NAMES:
        assert client.models.retrieve(name).id == name
        chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=2)
        assert chat.model == name and chat.choices[0].message.content is not None
        assert client.completions.create(model=name, prompt="count", max_tokens=2).model == name
        assert client.responses.create(model=name, input="hi", max_output_tokens=2).model == name
        msg = claude.messages.create(model=name, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert msg.model == name and msg.usage.input_tokens > 0
    # no model field (the fake engine's raw route accepts it): the first name
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                   timeout=60)
    assert r.status_code == 200 and r.json()["model"] == NAMES[0]


def test_an_unknown_id_is_a_404_everywhere(server):
    client = OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    for call in (lambda: client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}]),
                 lambda: client.completions.create(model="dsv4-", prompt="x", max_tokens=1),
                 lambda: client.responses.create(model="DSV4", input="x"),
                 lambda: client.models.retrieve("deepseek")):
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            call()
    claude = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=60)
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="claude", max_tokens=2, messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize("names", [["a", "b", "a"], ["a", " "]])
def test_empty_or_repeated_names_are_refused(names):
    from dsv4.serve import cli_serve
    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    args = p.parse_args(["--served-model-name", *names])
    with pytest.raises(ValueError, match="--served-model-name: names must be non-empty and distinct"):
        cli_serve.check_engine_arguments(args)


@pytest.mark.parametrize("argv, snapshots", [([], 16), (["--no-share-prompts"], 0), (["--prefix-snapshots", "0"], 0),
                                             (["--prefix-snapshots", "3"], 3)])
def test_prefix_snapshots_default_follows_prompt_sharing(argv, snapshots):
    """Snapshots are on by default (16), but not where prompt sharing is off (forks copy them): `--no-share-prompts`
    alone starts; asking for both is refused."""
    from dsv4.serve import cli_serve
    p = argparse.ArgumentParser()
    cli_serve.add_arguments(p)
    args = p.parse_args(argv)
    cli_serve.check_engine_arguments(args)
    assert cli_serve.prefix_snapshots(args) == snapshots
    both = p.parse_args(["--no-share-prompts", "--prefix-snapshots", "2"])
    with pytest.raises(ValueError, match="--prefix-snapshots needs prompt sharing"):
        cli_serve.check_engine_arguments(both)
