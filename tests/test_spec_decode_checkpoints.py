"""MTP speculative decoding (dsv4.engine.spec_decode) and its checkpoints: a checkpoint without a usable MTP block
(refused with speculation, served without it, with a clear error from the CLI), and the embedded trained model
(greedy outputs identical to the engine's without speculation, acceptance far above chance; the CLI prints the same
text). The random-model tests are in test_spec_decode.py."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from _spec_decode_helpers import PROMPT, SMALL, build_model, drain
from dsv4.checkpoint.writer import random_master_weights, write_checkpoint
from dsv4.cli import main as cli_main
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams
from dsv4.model import DeepseekV4ForCausalLM

EMBEDDED = Path(__file__).resolve().parents[1] / "dsv4" / "assets" / "tiny"


# ---- checkpoints without a usable mtp.0 ------------------------------------------------------

def test_missing_or_incomplete_mtp(tmp_path, caplog, capsys):
    full = random_master_weights(SMALL, seed=81)
    missing = write_checkpoint(tmp_path / "missing", SMALL, {k: t for k, t in full.items()
                                                             if not k.startswith("mtp.")})
    partial = write_checkpoint(tmp_path / "partial", SMALL, full)
    index = partial / "model.safetensors.index.json"
    shard = partial / json.loads(index.read_text())["weight_map"]["mtp.0.e_proj.weight"]
    tensors = load_file(shard)
    del tensors["mtp.0.e_proj.weight"], tensors["mtp.0.e_proj.scale"]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    weight_map = json.loads(index.read_text())
    for name in ("mtp.0.e_proj.weight", "mtp.0.e_proj.scale"):
        del weight_map["weight_map"][name]
    index.write_text(json.dumps(weight_map))

    spec = EngineConfig(max_model_len=32, speculative="mtp", num_draft_tokens=2)
    for path, what in ((missing, "mtp.0"), (partial, "mtp.0.e_proj")):
        with pytest.raises(ValueError, match="speculative='mtp' needs the checkpoint's complete MTP block") as e:
            LLMEngine.from_pretrained(path, device="cpu", engine_config=spec)
        assert what in str(e.value)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            engine = LLMEngine.from_pretrained(path, device="cpu", engine_config=EngineConfig(max_model_len=32))
        assert any("no usable MTP block" in r.getMessage() for r in caplog.records)
        engine.add_request("r", PROMPT, SamplingParams(temperature=0.0, max_tokens=3))
        assert len(drain(engine)["r"]["tokens"]) == 3
    capsys.readouterr()
    assert cli_main(["generate", "--model", str(missing), "--device", "cpu", "--speculative", "mtp", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dsv4 generate: error: speculative='mtp' needs") and "mtp.0" in err

    no_mtp = DeepseekV4ForCausalLM(SMALL, torch.float32)
    no_mtp.load_weights(full.items())
    no_mtp.finalize_weights()
    with pytest.raises(ValueError, match="needs the checkpoint's MTP block mtp.0"):
        LLMEngine(no_mtp, SMALL, None, spec)
    with pytest.raises(ValueError, match="speculative="):
        EngineConfig(speculative="eagle")
    model = build_model(SMALL, full)
    for k in (0, 5):
        with pytest.raises(ValueError, match="num_draft_tokens"):
            LLMEngine(model, SMALL, None, EngineConfig(max_model_len=32, speculative="mtp", num_draft_tokens=k))


# ---- the embedded trained model --------------------------------------------------------------

@pytest.mark.skipif(not (EMBEDDED / "config.json").is_file(), reason="embedded model not present")
def test_embedded_model_greedy_identical_and_acceptance():
    """Issue #8 acceptance on the trained model: batch 16 and batch 1, k = 1, 2, 3."""
    from dsv4.engine.spec_decode import mtp_problem
    problem = mtp_problem(EMBEDDED)
    if problem:
        pytest.skip(f"embedded model has no usable MTP block: {problem}")
    base = LLMEngine.from_pretrained(EMBEDDED, device="cpu", engine_config=EngineConfig(max_model_len=256))
    tok = base.tokenizer
    texts = ["The following methods can be defined to", "If the exception", "In 1905,", "A class",
             "The for statement", "Exceptions are", "The import system", "Objects", "Names refer to",
             "The with statement", "Lambda", "Comparisons", "The return statement", "Slicings",
             "Identifiers", "The try statement"]
    prompts = [tok.encode(t) if tok is not None else [5 + i, 9, 13] for i, t in enumerate(texts)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    for i, p in enumerate(prompts):
        base.add_request(f"r{i}", p, params)
    want = drain(base)
    for k in (1, 2, 3):
        for batch in (16, 1):
            engine = LLMEngine.from_pretrained(EMBEDDED, device="cpu", engine_config=EngineConfig(
                max_model_len=256, speculative="mtp", num_draft_tokens=k))
            for i, p in enumerate(prompts[:batch]):
                engine.add_request(f"r{i}", p, params)
            got = drain(engine)
            assert all(got[r]["tokens"] == want[r]["tokens"] for r in got), (k, batch)
            rate = engine.stats().spec_acceptance_rate
            print(f"embedded model k={k} batch={batch}: acceptance {rate:.3f}, mean accepted length "
                  f"{engine.stats().spec_mean_accepted_length:.2f}")
            assert rate > 2.0 / base.config.vocab_size  # a trained head is far above chance


@pytest.mark.skipif(not (EMBEDDED / "config.json").is_file(), reason="embedded model not present")
def test_cli_generate_speculative_prints_the_same_text(capsys):
    args = ["generate", "--device", "cpu", "--max-tokens", "12", "--temperature", "0", "--no-stream",
            "If the exception"]
    assert cli_main(args) == 0
    want = capsys.readouterr().out
    assert cli_main(args[:1] + ["--speculative", "mtp", "--num-draft-tokens", "3"] + args[1:]) == 0
    assert capsys.readouterr().out == want and want.strip()
    assert cli_main(args[:1] + ["--num-draft-tokens", "3"] + args[1:]) == 1
    assert "--num-draft-tokens needs --speculative mtp" in capsys.readouterr().err
