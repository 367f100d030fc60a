"""The Python API (`dsv4.engine.llm.LLM`) and the engine's text path on a tiny random checkpoint with a
tiny byte-level BPE tokenizer trained here: prompts as text and as token ids, results, streaming,
stop strings and EOS text rules, chat parsing, and a checkpoint without a tokenizer.

References: token ids from a full-forward greedy loop (the whole sequence re-run per token, no
decode state), text from `tokenizers.Tokenizer.decode` of those ids, prompts rendered by hand from
chat_encoding.md.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dsv4.checkpoint.writer import random_master_weights, tiny_config, write_checkpoint
from dsv4.engine.llm import LLM
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK_OPEN, THINK_CLOSE, DSML = "<think>", "</think>", "｜DSML｜"
SPECIALS = [BOS, EOS, USER, ASSISTANT, "<｜latest_reminder｜>", THINK_OPEN, THINK_CLOSE, DSML, "<｜action｜>",
            "<｜query｜>", "<｜authority｜>", "<｜domain｜>", "<｜title｜>", "<｜read_url｜>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "Engines schedule requests, split long prompts into chunks and stream tokens back to callers.",
    "A cache keeps keys and values; pages are freed when a request ends or is aborted early.",
    "Numbers like 12, 345 and 6789 appear next to words such as alpha, beta, gamma and delta.",
    "Caf\u00e9 na\u00efve \u00fcber \u00bd \u4f60\u597d \U0001f600 \u2014 a few characters outside ASCII.",
] * 3
MAX_LEN = 160


def train_tokenizer(vocab_size: int = 420) -> Tokenizer:
    """Byte-level BPE over the corpus's characters; the chat special strings are added tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                        show_progress=False))
    return tok


def write_tokenized_checkpoint(directory: Path, seed: int = 5) -> tuple[Path, Tokenizer]:
    """A tiny checkpoint whose vocabulary is exactly the tokenizer's, BOS/EOS ids as in config.json."""
    tok = train_tokenizer()
    cfg = tiny_config("fp4", layers="sliding,csa,hca", vocab_size=tok.get_vocab_size(with_added_tokens=True))
    assert (tok.token_to_id(BOS), tok.token_to_id(EOS)) == (cfg.bos_token_id, cfg.eos_token_id)
    write_checkpoint(directory, cfg, random_master_weights(cfg, seed=seed))
    tok.save(str(directory / "tokenizer.json"))
    return directory, tok


def full_forward_greedy(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    """Greedy continuation re-running the whole sequence from scratch per token; stops after EOS."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            hidden = model.forward(torch.tensor(ids), torch.arange(len(ids)))
            ids.append(int(model.compute_logits(hidden[-1:])[0].argmax()))
            if ids[-1] == eos:
                break
    return ids[len(prompt):]


def all_pages_free(engine: LLMEngine) -> bool:
    s = engine.stats()
    return not engine.has_unfinished() and s.free_pages == s.total_pages and not engine.cache.states


@pytest.fixture(scope="session")
def tok_ckpt(tmp_path_factory) -> tuple[Path, Tokenizer]:
    return write_tokenized_checkpoint(tmp_path_factory.mktemp("llm_tok"))


@pytest.fixture(scope="module")
def tok(tok_ckpt) -> Tokenizer:
    return tok_ckpt[1]


@pytest.fixture(scope="module")
def llm(tok_ckpt) -> LLM:
    return LLM(tok_ckpt[0], device="cpu", dtype=torch.float32, max_num_seqs=8, max_num_batched_tokens=64,
               max_model_len=MAX_LEN)


@pytest.fixture(scope="module")
def reference(llm):
    """Memoised full-forward greedy continuations, keyed by (prompt ids, n)."""
    cache: dict = {}

    def ref(prompt: list[int], n: int) -> list[int]:
        key = (tuple(prompt), n)
        if key not in cache:
            cache[key] = full_forward_greedy(llm.engine.model, prompt, n, llm.engine.eos_token_id)
        return cache[key]
    return ref


def expected_text(tok: Tokenizer, ids: list[int], eos: int) -> str:
    """The text rule: every generated token's text, except a final EOS."""
    return tok.decode(ids[:-1] if ids and ids[-1] == eos else ids, skip_special_tokens=False)


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, **kw)


PROMPTS = ["The quick brown fox", "Engines schedule requests and", "A cache keeps keys"]


# ---- generate ----------------------------------------------------------------------------------

def test_generate_text_prompts(llm, tok, reference):
    results = llm.generate(PROMPTS, greedy(10))
    assert len(results) == len(PROMPTS)
    for prompt, r in zip(PROMPTS, results):
        assert r.prompt_token_ids == tok.encode(prompt, add_special_tokens=False).ids
        assert r.token_ids == reference(r.prompt_token_ids, 10)
        assert r.text == expected_text(tok, r.token_ids, 1)
        assert r.finish_reason == ("stop" if r.token_ids[-1] == 1 else "length")
    assert len({r.text for r in results}) == len(PROMPTS) and all(r.text for r in results)
    assert all_pages_free(llm.engine)


def test_generate_token_id_prompts_and_per_prompt_params(llm, tok, reference):
    ids = [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS]
    single = llm.generate(ids[0], greedy(6))          # one prompt given as a flat id list
    assert len(single) == 1 and single[0].token_ids == reference(ids[0], 6)
    mixed = llm.generate([PROMPTS[1], ids[2]], [greedy(4), greedy(7)])  # text and ids mixed
    assert mixed[0].token_ids == reference(ids[1], 4)
    assert mixed[1].token_ids == reference(ids[2], 7)
    assert mixed[1].text == expected_text(tok, mixed[1].token_ids, 1)
    with pytest.raises(ValueError, match="SamplingParams"):
        llm.generate(PROMPTS, [greedy(2)])
    assert all_pages_free(llm.engine)


def test_generate_returns_logprobs_and_prompt_logprobs(llm, tok, reference):
    """GenerationResult.logprobs (one per generated token: greedy picks the best, so its logprob heads the top list)
    and .prompt_logprobs (None for the first prompt token, then each prompt token's, with 2 alternatives); without
    asking, neither."""
    ids = tok.encode(PROMPTS[0], add_special_tokens=False).ids
    r = llm.generate(ids, greedy(5, logprobs=3, prompt_logprobs=2))[0]
    assert r.token_ids == reference(ids, 5) and len(r.logprobs) == len(r.token_ids)
    for t, lp in zip(r.token_ids, r.logprobs):
        assert lp.token_id == t and len(lp.top) == 3 and lp.top[0] == (t, pytest.approx(lp.logprob))
        assert lp.logprob <= 0 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
    assert len(r.prompt_logprobs) == len(ids) and r.prompt_logprobs[0] is None
    assert [lp.token_id for lp in r.prompt_logprobs[1:]] == ids[1:]
    assert all(len(lp.top) == 2 and lp.logprob <= lp.top[0][1] + 1e-6 for lp in r.prompt_logprobs[1:])
    plain = llm.generate(ids, greedy(5))[0]
    assert plain.token_ids == r.token_ids and plain.logprobs == [] and plain.prompt_logprobs is None


def test_one_prompt_several_times_is_computed_once(llm, tok, reference):
    """Prompt sharing through the Python API: three copies of a 20-token prompt, the same greedy tokens as the
    full-forward reference; GenerationResult.cached_tokens: 0 for the first, 19 for the two that copied it."""
    ids = (tok.encode(" ".join(PROMPTS), add_special_tokens=False).ids * 3)[:20]
    results = llm.generate([ids] * 3, greedy(6))
    assert all(r.token_ids == reference(ids, 6) for r in results)
    assert [r.cached_tokens for r in results] == [0, 19, 19]
    assert all_pages_free(llm.engine)


def test_invalid_prompt_in_a_batch_leaves_nothing_behind(llm):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([[5, 6, 7], [5, 10**6]], greedy(3))
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([[5, 6, 7]], greedy(MAX_LEN))
    vocab = llm.engine.vocab_size
    with pytest.raises(ValueError, match=f"logit_bias token id {vocab} outside the vocabulary"):
        llm.generate([[5, 6, 7], [8, 9]], [greedy(3), SamplingParams(temperature=0, logit_bias={vocab: 1.0})])
    assert all_pages_free(llm.engine)


def test_max_tokens_none_stops_at_max_model_len(tok_ckpt, tok):
    small = LLM(tok_ckpt[0], device="cpu", dtype=torch.float32, max_model_len=24)
    r = small.generate([list(range(30, 50))], SamplingParams(temperature=0.0, ignore_eos=True))[0]
    assert len(r.token_ids) == 4 and r.finish_reason == "length"


# ---- streaming ---------------------------------------------------------------------------------

def test_stream_deltas_concatenate_to_generate(llm, tok):
    params = [greedy(12), greedy(5), greedy(9)]
    final = llm.generate(PROMPTS, params)
    text, ids, finished = ["", "", ""], [[], [], []], [0, 0, 0]
    for d in llm.stream(PROMPTS, params):
        assert not finished[d.index], "delta after the finished one"
        text[d.index] += d.text
        ids[d.index] += d.token_ids
        finished[d.index] += d.finished
        if d.finished:
            assert d.finish_reason == final[d.index].finish_reason
    assert finished == [1, 1, 1]
    for i, r in enumerate(final):
        assert ids[i] == r.token_ids and text[i] == r.text
        assert text[i] == expected_text(tok, ids[i], 1)


def test_stream_closed_early_frees_pages(llm):
    stream = llm.stream(PROMPTS, greedy(30))
    next(stream)
    assert llm.engine.has_unfinished()
    stream.close()  # the consumer walks away: its requests are aborted
    assert all_pages_free(llm.engine)


# ---- stop strings and EOS ----------------------------------------------------------------------

def stop_case(tok, ids: list[int], stop: str) -> tuple[list[int], str]:
    """Tokens up to the first one whose text contains `stop`, and the text before `stop`."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=False)
        if stop in text:
            return ids[:k], text[: text.find(stop)]
    raise AssertionError("stop string not in the text")


@pytest.mark.parametrize("where", ["middle", "start"])
def test_stop_strings_cut_text_and_stream_concatenates(llm, tok, where):
    base = llm.generate([PROMPTS[0]], greedy(24, ignore_eos=True))[0]
    full = base.text
    ascii_at = [i for i in range(len(full) - 3) if full[i:i + 3].isascii() and full[i:i + 3].isprintable()]
    assert ascii_at, f"no ASCII run in {full!r}"
    at = ascii_at[len(ascii_at) // 2] if where == "middle" else ascii_at[0]
    stop = full[at:at + 3]
    want_ids, want_text = stop_case(tok, base.token_ids, stop)
    # a long stop string that never matches makes the engine hold back 15 characters
    params = greedy(24, ignore_eos=True, stop=["never-matches-xyz", stop])
    streamed, deltas = "", 0
    for d in llm.stream([PROMPTS[0]], params):
        streamed += d.text
        deltas += 1
        if d.finished:
            assert d.finish_reason == "stop"
    r = llm.generate([PROMPTS[0]], params)[0]
    assert r.token_ids == want_ids and r.text == want_text and r.finish_reason == "stop"
    assert streamed == want_text and deltas == len(want_ids)

    engine = llm.engine  # the engine reports which stop string matched
    engine.add_request("stop-check", r.prompt_token_ids, params)
    last = None
    while engine.has_unfinished():
        for o in engine.step():
            last = o
    assert last.finished and last.stop_reason == stop


def test_eos_ends_generation_and_is_not_text(llm, tok, reference):
    """Make an ordinary token the EOS id (engine built with a patched config): generation stops on
    it, it stays in token_ids, its text is dropped; with ignore_eos it is ordinary text."""
    prompt = tok.encode(PROMPTS[2], add_special_tokens=False).ids
    ids = reference(prompt, 10)
    assert 1 not in ids, "precondition: the real EOS does not end the reference early"
    eos = ids[4]
    first = ids.index(eos)  # where generation must stop
    model = llm.engine.model
    engine = LLMEngine(model, dataclasses.replace(model.config, eos_token_id=eos), llm.tokenizer,
                       EngineConfig(max_num_seqs=4, max_model_len=MAX_LEN))
    engine.add_request("a", prompt, greedy(10))
    engine.add_request("b", prompt, greedy(first + 1, ignore_eos=True))
    got = {"a": ([], ""), "b": ([], "")}
    reasons = {}
    while engine.has_unfinished():
        for o in engine.step():
            toks, text = got[o.request_id]
            got[o.request_id] = (toks + o.token_ids, text + o.text)
            if o.finished:
                reasons[o.request_id] = o.finish_reason
    assert got["a"][0] == ids[: first + 1] and reasons["a"] == "stop"
    assert got["a"][1] == tok.decode(ids[:first], skip_special_tokens=False)
    assert got["b"][0] == ids[: first + 1] and reasons["b"] == "length"
    assert got["b"][1] == tok.decode(ids[: first + 1], skip_special_tokens=False)


# ---- chat --------------------------------------------------------------------------------------

@pytest.mark.parametrize("thinking", [False, True])
def test_chat_renders_generates_and_parses(llm, tok, reference, thinking):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "The lazy dog"}]
    r = llm.chat(messages, greedy(8), thinking=thinking)[0]
    # chat_encoding.md: BOS, system text, User turn, then the Assistant prefix with <think> (thinking)
    # or </think> (chat mode) as the generation prompt
    prompt = BOS + "Be brief." + USER + "The lazy dog" + ASSISTANT + (THINK_OPEN if thinking else THINK_CLOSE)
    assert r.prompt_token_ids == tok.encode(prompt, add_special_tokens=False).ids
    assert r.token_ids == reference(r.prompt_token_ids, 8)
    assert r.text == expected_text(tok, r.token_ids, 1)
    markers = [m for m in (BOS, USER, ASSISTANT, THINK_OPEN, THINK_CLOSE, DSML, "<｜") if m in r.text]
    assert not markers, f"precondition: plain generated text, got {r.text!r}"
    if thinking:  # the prompt leaves the model inside <think>: all of it is reasoning
        assert (r.reasoning_content, r.content) == (r.text, "")
    else:
        assert (r.reasoning_content, r.content) == (None, r.text)
    assert r.tool_calls == []


# ---- no tokenizer ------------------------------------------------------------------------------

def test_checkpoint_without_tokenizer(tok_ckpt, tok, llm, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(tok_ckpt[0], bare, ignore=shutil.ignore_patterns("tokenizer*"))
    plain = LLM(bare, device="cpu", dtype=torch.float32, max_model_len=MAX_LEN)
    assert plain.tokenizer is None
    ids = [tok.encode(p, add_special_tokens=False).ids for p in PROMPTS[:2]]
    got = plain.generate(ids, greedy(6))
    want = llm.generate(ids, greedy(6))
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.text == "" and w.text != ""
        assert g.finish_reason == w.finish_reason
    assert all(d.text == "" for d in plain.stream([ids[0]], greedy(3)))
    with pytest.raises(ValueError, match="tokenizer"):
        plain.generate("text needs a tokenizer", greedy(2))
    with pytest.raises(ValueError, match="tokenizer"):
        plain.chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="stop strings"):
        plain.generate([ids[0]], greedy(2, stop=["x"]))
