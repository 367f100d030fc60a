"""`dsv4 generate` / `dsv4 chat` as subprocesses on a tiny checkpoint with a tokenizer: stdout carries
exactly the generated text (the same as the Python API's), errors are one line on stderr with a
non-zero exit status."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4.engine.llm import LLM
from dsv4.engine.sampling_params import SamplingParams
from test_llm_api import write_tokenized_checkpoint

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["The quick brown fox", "Numbers like 12"]


def dsv4_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run `python -m dsv4 ...`; stdout/stderr decoded as UTF-8 without newline translation."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    res = subprocess.run([sys.executable, "-m", "dsv4", *args], cwd=REPO, env=env, capture_output=True,
                         input=None if stdin is None else stdin.encode(), timeout=120)
    res.stdout, res.stderr = res.stdout.decode("utf-8"), res.stderr.decode("utf-8")
    return res


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory) -> Path:
    return write_tokenized_checkpoint(tmp_path_factory.mktemp("cli_tok"), seed=11)[0]


@pytest.fixture(scope="module")
def llm(ckpt) -> LLM:
    return LLM(ckpt, device="cpu", dtype=torch.float32)


def test_generate_prints_only_the_generated_text(ckpt, llm):
    want = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=8))[0]
    assert len(want.token_ids) >= 1 and want.text
    res = dsv4_cli("generate", "--model", str(ckpt), "--max-tokens", "8", "--temperature", "0", PROMPTS[0])
    assert res.returncode == 0, res.stderr
    assert res.stdout == want.text + "\n"


def test_generate_several_prompts_one_line_each(ckpt, llm):
    want = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=5))
    res = dsv4_cli("generate", "--model", str(ckpt), "--max-tokens", "5", "--temperature", "0", *PROMPTS)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "".join(r.text + "\n" for r in want)


def test_generate_with_fp8_cache_prints_the_same_text(ckpt, llm):
    """--kv-dtype fp8 reaches the engine's pools; under reference numerics that storage is lossless."""
    want = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=6))
    res = dsv4_cli("generate", "--model", str(ckpt), "--max-tokens", "6", "--temperature", "0", "--kv-dtype", "fp8",
                   *PROMPTS)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "".join(r.text + "\n" for r in want)
    assert LLM(ckpt, device="cpu", dtype=torch.float32, kv_dtype="fp8").engine.cache.pools.fp8


def test_sampling_options_reach_the_engine(ckpt, llm):
    """--min-p, the penalties and --stop: the same text as the Python API with those SamplingParams (the stop
    string cut from it), and a different text than without them (seeded sampling: the random model's greedy
    margins are too wide for the penalties to turn a pick)."""
    plain = llm.generate(PROMPTS[0], SamplingParams(temperature=1.0, seed=3, max_tokens=10))[0].text
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=10, min_p=0.1, repetition_penalty=1.8,
                            presence_penalty=1.5, frequency_penalty=0.5)
    want = llm.generate(PROMPTS[0], params)[0].text
    assert want != plain and len(want) > 2
    stop = want[len(want) // 2:][:2]
    res = dsv4_cli("generate", "--model", str(ckpt), "--max-tokens", "10", "--temperature", "1", "--seed", "3",
                   "--min-p", "0.1", "--repetition-penalty", "1.8", "--presence-penalty", "1.5",
                   "--frequency-penalty", "0.5", "--stop", "never-seen", "--stop", stop, PROMPTS[0])
    assert res.returncode == 0, res.stderr
    assert res.stdout == want[:want.index(stop)] + "\n"


def test_a_bad_sampling_option_is_a_one_line_error_before_loading(tmp_path):
    line = one_line_error(dsv4_cli("generate", "--model", str(tmp_path / "absent"), "--top-p", "0", "hello"))
    assert "top_p" in line and "absent" not in line


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_no_overlap_reaches_the_engine(ckpt, command, monkeypatch):
    """--no-overlap turns the engine's look-ahead off; without it the engine decides (on where the model is on a
    GPU, so off here on the CPU)."""
    from dsv4.cli import build_parser
    from dsv4.cli_generate import _llm
    from dsv4.engine.llm_engine import LLMEngine
    from dsv4.serve.cli_serve import build_core
    configs = []
    real = LLMEngine.from_pretrained.__func__
    monkeypatch.setattr(LLMEngine, "from_pretrained", classmethod(
        lambda cls, *a, **k: configs.append(k["engine_config"]) or real(cls, *a, **k)))
    for flag, want in (([], None), (["--no-overlap"], False)):
        args = build_parser().parse_args([command, "--model", str(ckpt), "--device", "cpu", *flag,
                                          *(["x"] if command == "generate" else [])])
        engine = _llm(args).engine if command == "generate" else build_core(args)
        assert args.overlap is want and configs[-1].overlap is want and engine.overlap is False


def test_chat_reads_stdin_and_prints_the_reply_content(ckpt, llm):
    want = llm.chat([{"role": "user", "content": "The lazy dog"}], SamplingParams(temperature=0.0, max_tokens=6))[0]
    res = dsv4_cli("chat", "--model", str(ckpt), "--max-tokens", "6", "--temperature", "0", stdin="The lazy dog\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout == want.content + "\n"


def test_chat_second_turn_answers_as_a_fresh_conversation(ckpt, llm):
    """`dsv4 chat` keeps the last turn's cache for the next (retain_finished): the second reply is the one a fresh
    engine gives the whole history."""
    p = SamplingParams(temperature=0.0, max_tokens=6)
    first = llm.chat([{"role": "user", "content": "The lazy dog"}], p)[0].content
    history = [{"role": "user", "content": "The lazy dog"}, {"role": "assistant", "content": first},
               {"role": "user", "content": "Numbers like 12"}]
    second = llm.chat(history, p)[0].content
    res = dsv4_cli("chat", "--model", str(ckpt), "--max-tokens", "6", "--temperature", "0",
                   stdin="The lazy dog\nNumbers like 12\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout == first + "\n" + second + "\n"


def one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode != 0
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("dsv4 generate: error: ")
    return lines[0]


def test_missing_model_directory_is_a_one_line_error(tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    line = one_line_error(dsv4_cli("generate", "--model", str(missing), "--max-tokens", "2", "hello"))
    assert str(missing) in line


def test_text_prompt_without_tokenizer_is_a_one_line_error(ckpt, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(ckpt, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    line = one_line_error(dsv4_cli("generate", "--model", str(bare), "--max-tokens", "2", "hello"))
    assert "tokenizer" in line



@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_graphs_without_a_gpu_is_a_one_line_error(ckpt):
    line = one_line_error(dsv4_cli("generate", "--model", str(ckpt), "--device", "cpu", "--cuda-graphs", "hello"))
    assert "CUDA" in line


def test_bench_reports_json(ckpt):
    import json
    res = dsv4_cli("bench", "--model", str(ckpt), "--device", "cpu", "--batch", "2", "--prompt-len", "8",
                   "--output-len", "3")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert (result["batch"], result["steps"], result["speculative"], result["overlap"]) == (2, 3, None, False)
    assert (result["kv_dtype"], result["cuda_graphs"]) == ("auto", False)  # the CPU's defaults, resolved
    res = dsv4_cli("bench", "--model", str(ckpt), "--device", "cpu", "--batch", "1", "--prompt-len", "4",
                   "--output-len", "2", "--no-overlap")
    assert res.returncode == 0 and json.loads(res.stdout)["overlap"] is False, res.stderr
    assert result["decode_tok_per_s"] > 0


def test_token_budget_defaults_agree():
    """`dsv4 serve --max-num-batched-tokens`, `LLM` and `EngineConfig` share one default token budget per step
    (the parser keeps it as a literal so that building it imports no torch)."""
    import inspect

    from dsv4.cli import build_parser
    from dsv4.engine.llm import LLM
    from dsv4.engine.llm_engine import EngineConfig

    args = build_parser().parse_args(["serve", "--model", "somewhere"])
    llm_default = inspect.signature(LLM).parameters["max_num_batched_tokens"].default
    assert args.max_num_batched_tokens == EngineConfig.max_num_batched_tokens == llm_default


def test_structured_output_options(tmp_path):
    """--json-schema (a file) / --choice reach the engine (the embedded model: its byte-level vocabulary can spell
    JSON, this file's small one cannot): the same text as the Python API's, and in the format."""
    import json
    from dsv4.engine.structured import StructuredOutput
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["n"], "additionalProperties": False}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    want = LLM(device="cpu").generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20,
                                                                 structured=StructuredOutput(json=schema)))[0].text
    res = dsv4_cli("generate", "--device", "cpu", "--max-tokens", "20", "--json-schema",
                   str(tmp_path / "schema.json"), PROMPTS[0])
    assert res.returncode == 0 and res.stdout == want + "\n", res.stderr
    assert set(json.loads(want)) == {"n"}
    res = dsv4_cli("generate", "--device", "cpu", "--max-tokens", "8", "--choice", "red", "--choice", "blue",
                   "--temperature", "1", "--seed", "5", PROMPTS[1])
    assert res.returncode == 0 and res.stdout in ("red\n", "blue\n"), res.stderr
    line = one_line_error(dsv4_cli("generate", "--device", "cpu", "--regex", "[z-a]", PROMPTS[0]))
    assert "structured output regex" in line
