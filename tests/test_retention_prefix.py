"""SamplingParams.retain_prefix: retention keeps the cache at an earlier point of the prompt, for a next turn that
renders the end of this prompt differently (thinking mode: the history loses its reasoning, and this turn's
generation prompt `<｜Assistant｜><think>` comes back as `<｜Assistant｜></think>`).

References: the same requests through an engine without retention (greedy tokens equal exactly; tiny fp32 model of
test_engine.py); the chat encoding itself for where the next turn's prompt departs from this one's."""
from __future__ import annotations

import random

import pytest
import torch

from dsv4.chat.encoding import continuation_tokens, encode_messages
from dsv4.engine.llm import LLM
from dsv4.engine.sampling_params import SamplingParams
from test_engine import CFG, ckpt, drain, model  # noqa: F401  (fixtures)
from test_llm_api import MAX_LEN as LLM_MAX_LEN, tok_ckpt  # noqa: F401  (fixture)
from test_retention import counting_tokens, engine_with

A, THINK, CLOSE, END, USER = 3, 4, 5, 6, 7  # stand-ins for the chat encoding's special tokens


def token(rng: random.Random) -> int:
    return rng.randrange(8, CFG.vocab_size)


def thinking_turns(engine, rng: random.Random, n_turns: int, *, retain: bool, reasoning: int = 24):
    """A thinking-mode conversation in tokens: each prompt ends with [A, THINK]; the next one replaces THINK by
    CLOSE, then the reply (the output's last 3 tokens: its reasoning dropped), END, USER, new tokens, [A, THINK].
    Returns per turn (prompt, output)."""
    history, turns = [token(rng) for _ in range(40)], []
    for t in range(n_turns):
        prompt = history + [A, THINK]
        params = SamplingParams(temperature=0.0, max_tokens=reasoning, ignore_eos=True,
                                retain_prefix=len(prompt) - 1 if retain else None)
        engine.add_request(f"t{t}", prompt, params)
        out = drain(engine)[f"t{t}"]["tokens"]
        turns.append((prompt, out))
        history = history + [A, CLOSE, *out[-3:], END, USER] + [token(rng) for _ in range(rng.randrange(2, 9))]
    return turns


@pytest.mark.parametrize("overlap,share", [(False, True), (True, True), (False, False)])
def test_each_turn_reuses_the_last_prompt_but_its_generation_token(model, overlap, share):  # noqa: F811
    """Turn t + 1 adopts turn t's prompt but its last token and computes only the rest: the same tokens as without
    retention. The reasoning (24 tokens) is longer than the states can roll back, so retaining the finished
    sequence, as without retain_prefix, reuses nothing. Only the prefix copies are retained: with prompt sharing
    one per turn (forked, they stay); without, the adopter takes it (1 left)."""
    n = 4
    want = thinking_turns(engine_with(model, 0), random.Random(3), n, retain=True)
    plain = engine_with(model, 8, overlap=overlap, share=share)
    assert thinking_turns(plain, random.Random(3), n, retain=False) == want
    assert plain.stats().adopted_tokens == 0

    engine = engine_with(model, 8, overlap=overlap, share=share)
    computed = counting_tokens(engine)
    assert thinking_turns(engine, random.Random(3), n, retain=True) == want
    s = engine.stats()
    reused = [len(prompt) - 1 for prompt, _ in want[:-1]]
    assert (s.num_adopted, s.adopted_tokens) == (n - 1, sum(reused))
    assert sum(computed) == sum(len(p) + len(o) - 1 for p, o in want) - sum(reused)
    assert s.num_retained == (n if share else 1)
    assert engine.retained.eviction_order()[-1] == tuple(want[-1][0][:-1])
    engine.retained.clear()
    assert engine.stats().free_pages == engine.stats().total_pages


def test_a_regenerated_reply_computes_one_prompt_token(model):  # noqa: F811
    """The same prompt sent again (a regenerated reply) forks the retained prefix and computes its last token only;
    the entry stays for the next regeneration."""
    rng = random.Random(5)
    prompt = [token(rng) for _ in range(50)] + [A, THINK]
    engine = engine_with(model, 4)
    computed = counting_tokens(engine)
    outs = []
    for i in range(3):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True,
                                                           retain_prefix=len(prompt) - 1))
        outs.append(drain(engine)[f"r{i}"]["tokens"])
    assert outs[0] == outs[1] == outs[2]
    s = engine.stats()
    assert (s.num_adopted, s.adopted_tokens, s.num_retained) == (2, 2 * (len(prompt) - 1), 1)
    assert sum(computed) == len(prompt) + 3 * 19 + 2


def test_a_prefix_at_or_past_the_prompt_end_retains_the_finished_sequence(model):  # noqa: F811
    """retain_prefix >= the prompt's length changes nothing: the finished sequence is retained (its prompt and
    reply are what the next turn extends)."""
    rng = random.Random(8)
    prompt = [token(rng) for _ in range(30)]
    follow_new = [token(rng) for _ in range(5)]
    for k in (len(prompt), len(prompt) + 7):
        engine = engine_with(model, 2)
        engine.add_request("a", prompt, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                                       retain_prefix=k))
        out = drain(engine)["a"]["tokens"]
        engine.add_request("b", prompt + out + follow_new, SamplingParams(temperature=0.0, max_tokens=3))
        drain(engine)
        assert engine.stats().adopted_tokens == len(prompt) + len(out) - 1


@pytest.mark.parametrize("overlap", [False, True])
def test_a_reply_tokenized_differently_next_turn_reuses_the_prompt(model, overlap):  # noqa: F811
    """The next turn carries the reply as text, which the tokenizer may split otherwise than the model produced it
    (a tool call's "t"+"rue" comes back as "tr"+"ue"): the finished sequence is then no prefix of the next prompt,
    deeper than any state rolls back. retain_prefix = the whole prompt keeps a copy at the prompt's end, which the
    next turn adopts; without it nothing is reused. Outputs as without retention; a reply that comes back unchanged
    still adopts the finished sequence (the longer entry). With overlap, the copy is queued right after the prompt's
    forward, so the look-ahead still launches the next step behind it: as many look-ahead steps as without the copy
    (session 58; before, the step was held)."""
    rng = random.Random(11)
    prompt = [token(rng) for _ in range(60)]
    params = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    look_aheads = []
    for retain in (True, False):
        engine = engine_with(model, 4, overlap=overlap)
        engine.add_request("a", prompt, SamplingParams(**params, retain_prefix=len(prompt) if retain else None))
        out = drain(engine)["a"]["tokens"]
        look_aheads.append(engine.stats().look_ahead_steps)
        retold = out[:5] + [next(t for t in range(8, CFG.vocab_size) if t != out[5])] + out[6:]  # split anew
        follow = prompt + retold + [token(rng) for _ in range(4)]
        engine.add_request("b", follow, SamplingParams(**params))
        got = drain(engine)["b"]["tokens"]
        fresh = engine_with(model, 0)
        fresh.add_request("b", follow, SamplingParams(**params))
        assert got == drain(fresh)["b"]["tokens"]
        assert engine.stats().adopted_tokens == (len(prompt) if retain else 0)
    assert look_aheads[0] == look_aheads[1] and (look_aheads[0] > 20) == overlap
    engine.add_request("c", follow + got[:-1] + [token(rng)], SamplingParams(**params))  # b's reply unchanged
    drain(engine)
    assert engine.stats().adopted_tokens == len(follow) + len(got) - 1


@pytest.mark.parametrize("share", [True, False])
def test_a_prompt_sent_again_forks_its_prompt_end_copy(model, share):  # noqa: F811
    """A regenerated reply (the same prompt again) forks the copy kept at the prompt's end, rolled back a token:
    it computes only its last prompt token, and samples as the first did. Without prompt sharing the copy could
    only move, which would leave nothing to compute for the first token: it computes the prompt itself."""
    rng = random.Random(17)
    prompt = [token(rng) for _ in range(50)]
    engine = engine_with(model, 4, share=share)
    computed = counting_tokens(engine)
    outs = []
    for i in range(2):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True,
                                                           retain_prefix=len(prompt)))
        outs.append(drain(engine)[f"r{i}"]["tokens"])
    assert outs[0] == outs[1]
    reused = len(prompt) - 1 if share else 0
    assert engine.stats().adopted_tokens == reused
    assert sum(computed) == 2 * (len(prompt) + 9) - reused


def test_a_turns_other_entry_goes_before_the_one_forked(model):  # noqa: F811
    """A turn retains two entries (its prompt's end, its end). When the next turn forks one, the other is of no use
    to a continuation and is evicted before it: with room for 3, after two turns the first turn's end and the
    second turn's two entries are kept (the first turn's prompt-end copy went)."""
    rng = random.Random(13)
    engine = engine_with(model, 3)
    prompt = [token(rng) for _ in range(40)]
    params = dict(temperature=0.0, max_tokens=12, ignore_eos=True)
    turns = []
    for t in range(2):
        engine.add_request(f"t{t}", prompt, SamplingParams(**params, retain_prefix=len(prompt)))
        out = drain(engine)[f"t{t}"]["tokens"]
        turns.append((prompt, out))
        prompt = prompt + out + [token(rng) for _ in range(3)]
    (p0, o0), (p1, o1) = turns
    assert engine.stats().adopted_tokens == len(p0) + len(o0) - 1  # turn 1 forked turn 0's end
    kept = engine.retained.eviction_order()
    assert kept == [tuple(p0 + o0[:-1]), tuple(p1), tuple(p1 + o1[:-1])]


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "5"])
def test_bad_retain_prefix_names_the_field(bad):
    with pytest.raises(ValueError, match="retain_prefix"):
        SamplingParams(retain_prefix=bad)


# ---- where the next turn departs (the chat encoding) -----------------------------------------------------------

def conversation(rng: random.Random, turns: int) -> list[dict]:
    words = ["fox", "cache", "12", "engine", "déjà", "tokens", "?", "plan"]
    say = lambda: " ".join(rng.choice(words) for _ in range(rng.randrange(1, 6)))  # noqa: E731
    msgs = [{"role": "system", "content": say()}] if rng.random() < 0.5 else []
    for _ in range(turns):
        msgs.append({"role": "user", "content": say()})
        msgs.append({"role": "assistant", "content": say(), "reasoning_content": say()})
    return msgs + [{"role": "user", "content": say()}]


TOOLS = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize("mode,tools,drop", [("thinking", None, True), ("thinking", TOOLS, True),
                                             ("thinking", None, False), ("chat", None, True)])
def test_continuation_tokens_is_where_the_next_turn_departs(tok_ckpt, mode, tools, drop):  # noqa: F811
    """For random conversations, the next turn's tokens (a reply with reasoning and a new user message added)
    start with exactly the first k of this turn's: k = len - 1 in thinking mode without tools (its reasoning is
    dropped), all of them otherwise (the reply may come back tokenized otherwise: the copy is a fallback)."""
    from dsv4.chat.tokenizer import load_tokenizer
    tok = load_tokenizer(tok_ckpt[0])
    rng = random.Random(hash((mode, bool(tools), drop)) & 0xFFFF)
    options = dict(thinking_mode=mode, tools=tools, drop_thinking=drop)
    for turns in range(4):
        msgs = conversation(rng, turns)
        ids = tok.encode(encode_messages(msgs, **options))
        k = continuation_tokens(tok, ids, msgs, **options)
        nxt = msgs + [{"role": "assistant", "content": "sure", "reasoning_content": "think more"},
                      {"role": "user", "content": "and then"}]
        follow = tok.encode(encode_messages(nxt, **options))
        common = next(i for i in range(len(ids) + 1) if i == len(ids) or ids[i] != follow[i])
        assert common == len(ids) - (1 if mode == "thinking" and drop and not tools else 0)
        assert k == common


def test_chat_turns_in_thinking_mode_reuse_the_cache(tok_ckpt):  # noqa: F811
    """LLM.chat sets retain_prefix: the second thinking-mode turn takes all of the first turn's prompt but its
    last token from the cache, and replies as an engine without retention does."""
    def llm(retain: int) -> LLM:
        return LLM(tok_ckpt[0], device="cpu", dtype=torch.float32, max_num_seqs=4, max_num_batched_tokens=64,
                   max_model_len=LLM_MAX_LEN, retain_finished=retain)

    p = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    first_turn = [{"role": "system", "content": "You answer briefly and plainly."},  # (16 tokens at least)
                  {"role": "user", "content": "The lazy dog"}]
    fresh, kept = llm(0), llm(2)
    a = kept.chat(first_turn, p, thinking=True)[0]
    assert a.token_ids == fresh.chat(first_turn, p, thinking=True)[0].token_ids
    second_turn = first_turn + [{"role": "assistant", "content": "Sleeps.", "reasoning_content": a.text},
                                {"role": "user", "content": "Numbers like 12"}]
    b = kept.chat(second_turn, p, thinking=True)[0]
    assert b.cached_tokens == len(a.prompt_token_ids) - 1
    assert b.token_ids == fresh.chat(second_turn, p, thinking=True)[0].token_ids
