"""Structured outputs (dsv4.engine.structured) on the embedded tiny model and its real tokenizer (fp32, CPU).

References, independent of llguidance:
* a choice grammar's greedy output re-derived by a full-forward loop (`model.forward` on the whole token list per
  step, no decode state) that allows, at each step, the tokens whose decoded text keeps the output a prefix of a
  choice, and EOS once the output is a whole choice; the argmax over those (lowest id on a tie). Where every
  choice left continues with the same bytes, llguidance forces their canonical tokenisation (its documented
  default: the model stays on the tokenisations it was trained on), so there the rule allows only the first
  token of `tok.encode(forced bytes)` when they take more than one token;
* sampled outputs checked for membership with Python's `re` and a hand check of the JSON schema's rules;
* the bit layout of the masks against a per-token Python loop.
"""
from __future__ import annotations

import json
import os
import random
import re

import numpy as np
import pytest
import torch

import dsv4
from dsv4.chat.tokenizer import load_tokenizer
from dsv4.engine.assets import default_model_path
from dsv4.engine.llm_engine import EngineConfig, LLMEngine
from dsv4.engine.sampling_params import SamplingParams
from dsv4.engine.structured import StructuredOutput, apply_grammar_masks

CHOICES = ["yes", "no", "nothing at all", "maybe so", "42"]
REGEX = r"[0-9]{3}-[a-z]{2,4}"
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["color", "ok", "n", "tag"],
          "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tag": {"type": "string", "pattern": "^[a-z]{1,6}$"}}}


def schema_ok(text: str) -> bool:
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (isinstance(v, dict) and set(v) == {"color", "ok", "n", "tag"} and v["color"] in ("red", "green", "blue")
            and isinstance(v["ok"], bool) and type(v["n"]) is int and 0 <= v["n"] <= 999
            and isinstance(v["tag"], str) and re.fullmatch("[a-z]{1,6}", v["tag"]) is not None)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(default_model_path())


@pytest.fixture(scope="module")
def model():
    return dsv4.load_model(default_model_path(), dtype=torch.float32, numerics="reference", include_mtp=True)


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    rng = random.Random(20261205)
    texts = ["The answer is", "Question: is it true? Answer:", "def f(x):", "Numbers: 1, 2,"]
    # and two of random ids (ordinary tokens: past the specials at the start of the vocabulary)
    return [tok.encode(t) for t in texts] + [[rng.randrange(16, 2000) for _ in range(n)] for n in (7, 40)]


def engine_of(model, tok, **kw) -> LLMEngine:
    return LLMEngine(model, model.config, tok, EngineConfig(max_model_len=256, **kw))


def run(engine: LLMEngine, jobs: list[tuple[list[int], SamplingParams]]) -> list[tuple[list[int], str]]:
    for i, (p, sp) in enumerate(jobs):
        engine.add_request(str(i), p, sp)
    done: dict[str, tuple[list[int], str]] = {}
    toks: dict[str, list[int]] = {str(i): [] for i in range(len(jobs))}
    while engine.has_unfinished():
        for o in engine.step():
            toks[o.request_id] += o.token_ids
            if o.finished:
                done[o.request_id] = (toks[o.request_id], o.finish_reason)
    return [done[str(i)] for i in range(len(jobs))]


def choice_reference(model, tok, prompt: list[int], max_steps: int = 16) -> tuple[list[int], int]:
    """(the greedy tokens under the choice rule, how many steps the unconstrained argmax was not allowed)."""
    eos, vocab = model.config.eos_token_id, model.config.vocab_size
    out: list[int] = []
    overruled = 0
    with torch.inference_mode():
        for _ in range(max_steps):
            ids = prompt + out
            logits = model.compute_logits(model.forward(torch.tensor(ids), torch.arange(len(ids)))[-1:])[0].double()
            text = tok.decode(out)
            rests = [c[len(text):] for c in CHOICES if c.startswith(text)]
            forced = os.path.commonprefix(rests)
            canonical = tok.encode(forced)
            allowed = torch.zeros(vocab, dtype=torch.bool)
            for t in range(vocab):
                if t == eos:
                    allowed[t] = text in CHOICES
                elif len(canonical) > 1 or (canonical and all(r == forced for r in rests)):
                    allowed[t] = t == canonical[0]
                else:
                    s = tok.decode(out + [t])
                    allowed[t] = len(s) > len(text) and any(c.startswith(s) for c in CHOICES)
            best = int(torch.where(allowed, logits, -torch.inf).argmax())
            overruled += int(logits.argmax()) != best
            out.append(best)
            if best == eos:
                break
    return out, overruled


def test_choice_greedy_matches_an_independent_constraint(model, tok, prompts):
    got = run(engine_of(model, tok), [(p, SamplingParams(temperature=0, max_tokens=16,
                                                          structured=StructuredOutput(choice=CHOICES)))
                                       for p in prompts])
    overruled = 0
    for p, (ids, finish) in zip(prompts, got):
        ref, n = choice_reference(model, tok, p)
        overruled += n
        assert ids == ref and finish == "stop"
        assert tok.decode(ids[:-1]) in CHOICES
    assert overruled >= len(prompts)  # the grammar decided the first token at least, in every prompt


@pytest.mark.parametrize("overlap", [False, True])
def test_sampled_outputs_are_in_the_language_and_leave_other_rows_alone(model, tok, prompts, overlap):
    seeds = random.Random().sample(range(10**6), 4)
    kinds = [StructuredOutput(regex=REGEX), StructuredOutput(json=SCHEMA), StructuredOutput(json=json.dumps(SCHEMA)),
             StructuredOutput(choice=CHOICES)]
    jobs = [(prompts[i % len(prompts)], SamplingParams(temperature=1.0, top_p=0.95, seed=s, max_tokens=80,
                                                       structured=so)) for i, (so, s) in enumerate(zip(kinds, seeds))]
    free = [(p, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)) for p in prompts[:2]]
    got = run(engine_of(model, tok, overlap=overlap), jobs + free)
    texts = [tok.decode(ids[:-1]) for ids, _ in got[:4]]
    assert all(f == "stop" for _, f in got[:4]), got
    assert re.fullmatch(REGEX, texts[0]), texts[0]
    assert schema_ok(texts[1]) and schema_ok(texts[2]), texts
    assert texts[3] in CHOICES
    alone = run(engine_of(model, tok, overlap=overlap), free)
    assert got[4:] == alone


def test_look_ahead_keeps_running_with_grammar_rows(model, tok, prompts):
    """overlap: a look-ahead batch with grammar rows is launched without its pick, which the next step makes once
    the ids it depends on are read; the tokens equal the engine's without overlap, and look-ahead steps ran."""
    kinds = [StructuredOutput(json=SCHEMA), StructuredOutput(choice=CHOICES), StructuredOutput(regex=REGEX)]
    seeds = random.Random().sample(range(10**6), 3)
    jobs = [(p, SamplingParams(temperature=0, max_tokens=60, structured=so)) for p, so in zip(prompts, kinds)]
    jobs += [(prompts[3], SamplingParams(temperature=1.0, seed=s, max_tokens=60, structured=so))
             for s, so in zip(seeds, kinds)]
    jobs.append((prompts[4], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)))
    plain = run(engine_of(model, tok, overlap=False), jobs)
    engine = engine_of(model, tok, overlap=True)
    assert run(engine, jobs) == plain
    assert engine.look_ahead_steps >= 10, engine.look_ahead_steps


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_decoding_follows_the_grammar(model, tok, prompts, k):
    kinds = [StructuredOutput(json=SCHEMA), StructuredOutput(choice=CHOICES), StructuredOutput(regex=REGEX)]
    greedy = [(p, SamplingParams(temperature=0, max_tokens=60, structured=so)) for p in prompts[:2] for so in kinds]
    plain = run(engine_of(model, tok), greedy)
    engine = engine_of(model, tok, speculative="mtp", num_draft_tokens=k)
    assert run(engine, greedy) == plain
    stats = engine.stats()
    assert stats.spec_draft_tokens > 0 and stats.spec_accepted_tokens > 0
    seeds = random.Random().sample(range(10**6), 3)
    sampled = run(engine_of(model, tok, speculative="mtp", num_draft_tokens=k),
                  [(prompts[2], SamplingParams(temperature=1.0, seed=s, max_tokens=80, structured=so))
                   for s, so in zip(seeds, kinds)])
    texts = [tok.decode(ids[:-1]) for ids, _ in sampled]
    assert all(f == "stop" for _, f in sampled), sampled
    assert schema_ok(texts[0]) and texts[1] in CHOICES and re.fullmatch(REGEX, texts[2]), texts


def test_grammar_starts_after_its_token(model, tok, prompts):
    """start_after (the chat's end of reasoning): the tokens up to it are the unconstrained ones, the rest a
    choice."""
    p = prompts[0]
    (free, _), = run(engine_of(model, tok), [(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))])
    at = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    so = StructuredOutput(choice=CHOICES, start_after=free[at])
    (ids, finish), = run(engine_of(model, tok), [(p, SamplingParams(temperature=0, max_tokens=40, structured=so))])
    assert ids[: at + 1] == free[: at + 1] and finish == "stop"
    assert tok.decode(ids[at + 1: -1]) in CHOICES


def test_n_choices_share_the_prompt_and_keep_their_own_grammar_state(model, tok, prompts):
    p = prompts[5]
    seeds = random.Random().sample(range(10**6), 3)
    engine = engine_of(model, tok)
    got = run(engine, [(p, SamplingParams(temperature=1.0, seed=s, max_tokens=80,
                                          structured=StructuredOutput(json=SCHEMA))) for s in seeds])
    assert engine.stats().num_forks == 2
    assert all(f == "stop" and schema_ok(tok.decode(ids[:-1])) for ids, f in got), got


@pytest.mark.parametrize("so, words", [
    (dict(regex="(unclosed"), "regex"),
    (dict(grammar="start: missing_rule"), "grammar"),
    (dict(json={"type": "objectx"}), "json"),
])
def test_bad_grammars_are_refused_before_queueing(model, tok, so, words):
    engine = engine_of(model, tok)
    with pytest.raises(ValueError, match=rf"request 'r': structured output {words}: \S"):
        engine.add_request("r", [5, 6, 7], SamplingParams(structured=StructuredOutput(**so)))
    assert not engine.has_unfinished() and not engine.streams


@pytest.mark.parametrize("kw, match", [
    (dict(), "exactly one of"), (dict(regex="a", choice=["a"]), "exactly one of"), (dict(choice="ab"), "list"),
    (dict(choice=["a", ""]), "non-empty"), (dict(json="{not json"), "not valid JSON"), (dict(json="[1]"), "object"),
    (dict(regex=""), "non-empty"), (dict(json_object=1), "bool"), (dict(regex="a", start_after=-1), "token id"),
])
def test_structured_output_fields_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        StructuredOutput(**kw)


def test_a_model_without_tokenizer_refuses_structured_outputs(model):
    engine = LLMEngine(model, model.config, None, EngineConfig(max_model_len=64))
    with pytest.raises(ValueError, match="need the checkpoint's tokenizer"):
        engine.add_request("r", [5, 6], SamplingParams(structured=StructuredOutput(regex="a+")))
    assert not engine.has_unfinished()


@pytest.mark.parametrize("vocab", [37, 64, 2050])
def test_mask_bits_match_a_per_token_loop(vocab):
    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32 - (vocab == 2050)  # 2050: the mask stops short of the vocabulary
    masks = [np.random.default_rng(vocab + i).integers(-2**31, 2**31, words, dtype=np.int64).astype(np.int32)
             for i in range(3)]
    rows = [masks[0], None, masks[1], masks[2]]
    logits = torch.randn(4, vocab, generator=g)
    out = apply_grammar_masks(logits, rows)
    for r, m in enumerate(rows):
        for t in range(vocab):
            allowed = m is None or (t < 32 * len(m) and (int(m[t // 32]) >> (t % 32)) & 1)
            assert out[r, t].item() == (logits[r, t].item() if allowed else -np.inf), (r, t)
    assert apply_grammar_masks(logits, [None] * 4) is logits and apply_grammar_masks(logits, None) is logits


def test_masks_of_many_rows_at_once_equal_one_at_a_time(model, tok):
    """grammar_masks computes live rows together on llguidance's threads: the same words as each row's own
    compute_bitmask, at random points of random valid outputs (and rows not armed yet, or without a grammar)."""
    from dsv4.engine.sequence import Sequence
    from dsv4.engine.structured import grammar_masks
    engine = engine_of(model, tok)
    rng = random.Random()
    kinds = [StructuredOutput(json=SCHEMA), StructuredOutput(regex=REGEX), StructuredOutput(choice=CHOICES),
             StructuredOutput(json_object=True), StructuredOutput(regex=REGEX, start_after=5)]
    seqs = []
    for k in range(12):
        seq = Sequence(str(k), [3, 4])
        if k % 6:
            seq.grammar = engine.grammars.state(kinds[k % len(kinds)])
            for _ in range(rng.randrange(0, 6)):  # a random walk through allowed tokens
                mask = seq.grammar.mask()
                allowed = [] if mask is None else [t for t in range(2048) if (int(mask[t // 32]) >> (t % 32)) & 1]
                allowed = [t for t in allowed if t != tok.eos_id] or [rng.randrange(16, 2000)]
                seq.token_ids.append(rng.choice(allowed))
                seq.grammar.advance(seq.output_token_ids)
        seqs.append(seq)
    together = grammar_masks(seqs)
    alone = [s.grammar.mask() if s.grammar is not None else None for s in seqs]
    assert sum(m is not None for m in together) >= 6
    for a, b in zip(together, alone):
        assert (a is None and b is None) or np.array_equal(a, b)


def test_a_tokenizer_llguidance_cannot_read_is_a_clear_error(caplog):
    from dsv4.engine.structured import Grammars

    class Unreadable:
        def to_json(self) -> str:
            return '{"model": "not a tokenizer"}'

    grammars = Grammars(Unreadable(), 100, [1])
    grammars.prepare()  # logged, not raised: the engine starts, structured requests are refused
    assert "structured outputs unavailable" in caplog.text
    with pytest.raises(ValueError, match="llguidance cannot read the tokenizer"):
        grammars.state(StructuredOutput(regex="a+"))


def test_compiled_grammars_are_reused_and_their_copies_independent(tok):
    """A grammar that comes again is copied from its compiled matcher: the copies start where a fresh compile
    does and do not share their progress; the cache keeps COMPILED_GRAMMARS at most, dropping the oldest."""
    from dsv4.engine import structured
    grammars = structured.Grammars(tok, 2048, [tok.eos_id])
    so = StructuredOutput(json=SCHEMA)
    first, second = grammars.state(so), grammars.state(StructuredOutput(json=json.dumps(SCHEMA), start_after=9))
    assert len(grammars._compiled) == 1 and first.matcher is not second.matcher and second.start_after == 9
    text = tok.encode('{"color": "red", ')
    first.advance(text)
    fresh = structured.Grammars(tok, 2048, [tok.eos_id]).state(so)
    assert np.array_equal(second._mask(), fresh._mask())  # untouched by first's progress (second is not armed)
    fresh.advance(text)
    assert np.array_equal(first.mask(), fresh.mask())
    for i in range(structured.COMPILED_GRAMMARS + 3):
        grammars.state(StructuredOutput(regex=f"a{{{i + 1}}}"))
    assert len(grammars._compiled) == structured.COMPILED_GRAMMARS and so.cache_key not in grammars._compiled


def test_llm_chat_in_thinking_mode_formats_the_answer(tok):
    """LLM.chat(thinking=True): the grammar starts after the reasoning (a bias makes the tiny model close it at
    once); without that, the first token would have to open the JSON and no answer would follow a reasoning."""
    from dsv4 import LLM
    llm = LLM(device="cpu")
    params = SamplingParams(temperature=0, max_tokens=60, structured=StructuredOutput(json=SCHEMA),
                            logit_bias={tok.think_close_id: 100.0})
    (r,) = llm.chat([{"role": "user", "content": "Give me a record."}], params, thinking=True)
    assert not r.reasoning_content and schema_ok(r.content), (r.reasoning_content, r.content)
    assert params.structured.start_after is None  # the caller's params are left as they were
