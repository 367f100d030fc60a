"""`dsv4 run-batch` (dsv4.serve.run_batch) on the embedded tiny model.

Reference: the Python API (`dsv4.LLM`, which drives the engine without the server) for the same greedy requests:
the texts of the batch's results must be its texts. Also: results in input order with their custom_id, a refused
request kept as its 4xx line, and a bad input file rejected with the line named before anything runs (no output).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsv4
from dsv4.cli import main
from dsv4.engine.sampling_params import SamplingParams

MODEL_DIR = Path(__file__).resolve().parents[1] / "dsv4" / "assets" / "tiny"
pytestmark = pytest.mark.skipif(not (MODEL_DIR / "tokenizer.json").is_file(), reason="no embedded tiny model")


def line(cid: str, url: str, body: dict) -> str:
    return json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body})


def test_a_batch_answers_as_the_python_api(tmp_path, capsys):
    chats = [[{"role": "user", "content": "Name a colour."}], [{"role": "system", "content": "Be brief."},
                                                               {"role": "user", "content": "Why?"}]]
    prompts = ["Once upon a time", "The list of"]
    lines = [line("chat0", "/v1/chat/completions", {"messages": chats[0], "max_tokens": 9, "temperature": 0}),
             line("cmpl", "/v1/completions", {"prompt": prompts, "max_tokens": 7, "temperature": 0}),
             line("refused", "/v1/chat/completions", {"messages": chats[0], "max_tokens": 0}),
             line("resp", "/v1/responses", {"input": chats[1], "max_output_tokens": 6, "temperature": 0}),
             line("chat1", "/v1/chat/completions", {"messages": chats[1], "max_tokens": 6, "temperature": 0})]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n")  # (a blank line is skipped)
    assert main(["run-batch", "-i", str(src), "-o", str(out), "--device", "cpu", "--max-model-len", "256"]) == 0
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["chat0", "cmpl", "refused", "resp", "chat1"]
    assert len({r["id"] for r in results}) == 5 and all(r["error"] is None for r in results)
    by = {r["custom_id"]: r["response"] for r in results}
    assert [by[c]["status_code"] for c in ("chat0", "cmpl", "refused", "resp", "chat1")] == [200, 200, 400, 200, 200]
    assert by["refused"]["body"]["error"]["param"] == "max_tokens"
    assert by["cmpl"]["request_id"] == by["cmpl"]["body"]["id"]

    llm = dsv4.LLM(device="cpu")
    want_chat = [llm.chat(c, SamplingParams(temperature=0, max_tokens=n))[0].content for c, n in zip(chats, (9, 6))]
    assert by["chat0"]["body"]["choices"][0]["message"]["content"] == want_chat[0]
    assert by["chat1"]["body"]["choices"][0]["message"]["content"] == want_chat[1]
    want_cmpl = [r.text for r in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=7))]
    assert [c["text"] for c in by["cmpl"]["body"]["choices"]] == want_cmpl
    resp = by["resp"]["body"]
    assert resp["output"][0]["content"][0]["text"] == llm.chat(
        chats[1], SamplingParams(temperature=0, max_tokens=6))[0].content
    assert "5 requests, 4 answered, 1 refused" in capsys.readouterr().err


@pytest.mark.parametrize("text, words", [
    ('{"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x"}}\nnot json\n', "line 2: not JSON"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {}}\n' * 2, "line 2: custom_id 'a' is used twice"),
    ('{"custom_id": "a", "url": "/v1/embeddings", "body": {}}\n', "line 1: url must be one of"),
    ('{"custom_id": "a", "method": "GET", "url": "/v1/completions", "body": {}}\n', "line 1: method must be POST"),
    ('{"url": "/v1/completions", "body": {}}\n', "line 1: custom_id must be a non-empty string"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": []}\n', "line 1: body must be a JSON object"),
    ('{"custom_id": "a", "url": "/v1/completions", "body": {"stream": true}}\n', "line 1: stream is not supported"),
    ('[1]\n', "line 1: expected a JSON object"),
    ("\n\n", "no requests")])
def test_a_bad_file_is_refused_before_anything_runs(tmp_path, capsys, text, words):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(text)
    assert main(["run-batch", "-i", str(src), "-o", str(out), "--device", "cpu", "--model", str(tmp_path)]) == 1
    err = capsys.readouterr().err  # (--model names no checkpoint: nothing was loaded)
    assert words in err and str(src) in err and not out.exists(), err


def test_a_missing_output_directory_is_refused(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text(line("a", "/v1/completions", {"prompt": "x"}) + "\n")
    assert main(["run-batch", "-i", str(src), "-o", str(tmp_path / "no" / "out.jsonl"), "--device", "cpu"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_two_ranks_answer_as_one_process(tmp_path):
    """`--tp 2 --ep 2` (ranks spawned by the CLI): rank 0 writes the results, the same greedy texts as one process."""
    import os
    import subprocess
    import sys

    src = tmp_path / "in.jsonl"
    src.write_text(line("c", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                      "max_tokens": 6, "temperature": 0}) + "\n"
                   + line("p", "/v1/completions", {"prompt": ["If the exception", "The"], "max_tokens": 6,
                                                   "temperature": 0}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    texts = []
    for extra in ([], ["--tp", "2", "--ep", "2"]):
        out = tmp_path / f"out{len(extra)}.jsonl"
        run = subprocess.run([sys.executable, "-m", "dsv4", "run-batch", "-i", str(src), "-o", str(out),
                              "--device", "cpu", "--max-model-len", "128", *extra],
                             env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        results = [json.loads(x)["response"]["body"] for x in out.read_text().splitlines()]
        texts.append([results[0]["choices"][0]["message"]["content"], *[c["text"] for c in results[1]["choices"]]])
    assert texts[0] == texts[1] and any(t.strip() for t in texts[0])


def test_an_interrupted_batch_goes_on_from_its_answers(tmp_path, capsys):
    """OUT.partial as an interrupted run leaves it: one kept answer (not asked again: its made-up text stays), a
    5xx (asked again), and a torn last line; the run answers the rest, writes OUT in input order, removes the
    partial file."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    reqs = [("a", {"prompt": "One", "max_tokens": 3, "temperature": 0}),
            ("b", {"prompt": "Two", "max_tokens": 3, "temperature": 0}),
            ("c", {"prompt": "Three", "max_tokens": 3, "temperature": 0})]
    src.write_text("".join(line(cid, "/v1/completions", body) + "\n" for cid, body in reqs))
    kept = {"id": "batch_req_kept", "custom_id": "b", "error": None,
            "response": {"status_code": 200, "request_id": "x", "body": {"choices": [{"text": "KEPT"}]}}}
    failed = {"id": "batch_req_503", "custom_id": "a", "error": None,
              "response": {"status_code": 503, "request_id": "", "body": {"error": {"message": "engine stopped"}}}}
    partial = tmp_path / "out.jsonl.partial"
    partial.write_text(json.dumps(kept) + "\n" + json.dumps(failed) + "\n" + '{"custom_id": "c", "resp')
    assert main(["run-batch", "-i", str(src), "-o", str(out), "--device", "cpu", "--max-model-len", "128"]) == 0
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["a", "b", "c"] and not partial.exists()
    assert results[1] == kept
    assert [r["response"]["status_code"] for r in results] == [200, 200, 200]
    assert results[0]["response"]["body"]["choices"][0]["text"] != "KEPT"
    assert "resuming: 1 of 3 requests" in capsys.readouterr().err


def test_a_shared_system_prompt_is_computed_about_twice(tmp_path):
    """Six chat requests with one 300-character system prompt: with run-batch's default prefix snapshots most of
    them take the prefix from a snapshot (usage's cached_tokens), with the texts of `--prefix-snapshots 0`."""
    system = {"role": "system", "content": "You answer questions about Python precisely and briefly. " * 5}
    # (questions of several words, each with its own first word: no prompt can fork another running one within
    # the 4 tokens a state rolls back, so without snapshots nothing is cached)
    asks = ["Explain what a tuple is for.", "Describe how zip pairs items up.", "Why would anyone use a closure?",
            "Show me enumerate in a for loop.", "Define a set and its main uses.",
            "Compare a dict with a list, please."]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(line(f"q{i}", "/v1/chat/completions", {"messages": [system, {"role": "user", "content": q}],
                                                                  "max_tokens": 5, "temperature": 0}) + "\n"
                           for i, q in enumerate(asks)))
    runs = {}
    for snapshots in ([], ["--prefix-snapshots", "0"]):
        out = tmp_path / f"out{len(snapshots)}.jsonl"
        assert main(["run-batch", "-i", str(src), "-o", str(out), "--device", "cpu", "--max-model-len", "256",
                     *snapshots]) == 0
        runs[len(snapshots)] = [json.loads(x)["response"]["body"] for x in out.read_text().splitlines()]
    texts = {k: [b["choices"][0]["message"]["content"] for b in v] for k, v in runs.items()}
    assert texts[0] == texts[2]
    cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in runs[0]]
    assert sum(c >= 64 for c in cached) >= 3, cached
    assert all(b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for b in runs[2])
