"""ChatTokenizer (tokenizer.json wrapper) and IncrementalDetokenizer, on small tokenizers trained here
(< 1 s). References: an independent byte-level decode (GPT-2 byte table + Python's UTF-8 decoder)
and the whole-sequence decode of the `tokenizers` library."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from dsv4.chat.detok import IncrementalDetokenizer
from dsv4.chat.encoding import ASSISTANT, BOS, DSML, EOS, THINK_CLOSE, THINK_OPEN, USER, encode_messages
from dsv4.chat.parser import StreamingParser, parse_completion
from dsv4.chat.tokenizer import ChatTokenizer, load_tokenizer

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "chat_encoding"
LINES = [
    "Hello world, 你好世界！这是一个测试。",
    "emoji 😀🎉👍🏽 and 深度求索 DeepSeek, 温泉煮鸡蛋 97℃",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 café naïve Ünïcödé — “quotes” ½ ∑",
    "The quick brown fox jumps over the lazy dog. 1234567890",
] * 3
# Specials in a non-obvious order: the trainer gives them ids 0..6 in this order.
SPECIALS = [THINK_CLOSE, DSML, EOS, USER, BOS, THINK_OPEN, ASSISTANT]
REPLACEMENT = "\ufffd"


def train_byte_level(specials=SPECIALS, vocab_size: int = 330) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(LINES, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    # A BOS-adding post-processor, as many checkpoints ship: encode() must not apply it.
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


@pytest.fixture(scope="module")
def byte_tok() -> Tokenizer:
    return train_byte_level()


@pytest.fixture(scope="module")
def chat_tok(byte_tok, tmp_path_factory) -> ChatTokenizer:
    d = tmp_path_factory.mktemp("ckpt")
    byte_tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": BOS}, "eos_token": EOS,
                                                         "add_bos_token": False}), encoding="utf-8")
    tok = load_tokenizer(d)
    assert tok is not None
    return tok


def _byte_table() -> dict[str, int]:
    """GPT-2 byte <-> printable-character table, re-derived: printable Latin-1 bytes map to
    themselves, the other bytes to 256, 257, ... in byte order."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


BYTE_TABLE = _byte_table()


def token_bytes(tok: Tokenizer, ids: list[int]) -> bytes:
    out = b""
    for i in ids:
        piece = tok.id_to_token(i)
        out += piece.encode() if piece in SPECIALS else bytes(BYTE_TABLE[c] for c in piece)
    return out


def complete_prefix(data: bytes) -> str:
    """The text of `data` up to its last complete UTF-8 character (data is valid except at its end)."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError("more than 3 trailing bytes of an incomplete character")


# ---- ChatTokenizer -------------------------------------------------------------------------------

def test_special_ids_come_from_the_vocabulary(chat_tok, byte_tok):
    names = {THINK_CLOSE: "think_close", DSML: "dsml", EOS: "eos", USER: "user", BOS: "bos",
             THINK_OPEN: "think_open", ASSISTANT: "assistant"}
    assert chat_tok.special_ids == {names[s]: i for i, s in enumerate(SPECIALS)}
    assert (chat_tok.bos_id, chat_tok.eos_id, chat_tok.think_close_id, chat_tok.dsml_id) == (4, 2, 0, 1)
    assert chat_tok.latest_reminder_id is None
    assert chat_tok.vocab_size == byte_tok.get_vocab_size()


def _official_prompts() -> list[str]:
    if not FIXTURES.is_dir():
        pytest.skip(f"chat-encoding fixtures not found at {FIXTURES}")
    return [(FIXTURES / f"test_output_{i}.txt").read_text(encoding="utf-8") for i in range(1, 5)]


def test_encode_prompts_specials_atomic_no_extra_bos(chat_tok, byte_tok):
    prompts = _official_prompts() + [encode_messages([{"role": "user", "content": "你好 😀"}])]
    for prompt in prompts:
        ids = chat_tok.encode(prompt)
        assert chat_tok.decode(ids) == prompt
        assert token_bytes(byte_tok, ids) == prompt.encode("utf-8")
        for text, name in ((BOS, "bos"), (EOS, "eos"), (USER, "user"), (ASSISTANT, "assistant"),
                           (THINK_OPEN, "think_open"), (THINK_CLOSE, "think_close")):
            assert ids.count(chat_tok.special_ids[name]) == prompt.count(text)
        assert ids[0] == chat_tok.bos_id
    assert chat_tok.bos_id not in chat_tok.encode("plain text")
    assert byte_tok.encode("plain text").ids[0] == chat_tok.bos_id   # what a careless encode would do


def test_load_tokenizer_errors(tmp_path, byte_tok):
    assert load_tokenizer(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(tmp_path)
    byte_tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}), encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer_config.json.*bos_token"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[", encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        load_tokenizer(tmp_path)


def test_missing_or_non_atomic_special_token_is_rejected(tmp_path):
    no_think = train_byte_level([s for s in SPECIALS if s != THINK_OPEN], vocab_size=300)
    no_think.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="<think>"):
        ChatTokenizer.from_file(tmp_path / "tokenizer.json")
    # "<think>" in the vocabulary but not as an added token: the pre-tokenizer splits it
    vocab = {"[UNK]": 0, **{s: i + 1 for i, s in enumerate(SPECIALS)}}
    word = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    word.add_special_tokens([s for s in SPECIALS if s != THINK_OPEN])
    with pytest.raises(ValueError, match="not an added token"):
        ChatTokenizer(word, source="word.json")


# ---- IncrementalDetokenizer ----------------------------------------------------------------------

def test_full_decode_matches_independent_byte_reference(byte_tok):
    rng = random.Random(5)
    vocab = byte_tok.get_vocab_size()
    for _ in range(500):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        assert byte_tok.decode(ids, skip_special_tokens=False) == \
            token_bytes(byte_tok, ids).decode("utf-8", errors="replace")


def run(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add(i) for i in ids] + [detok.flush()]


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_random_ids_deltas_concatenate_to_full_decode(chat_tok, byte_tok, skip_special_tokens):
    rng = random.Random(11 + skip_special_tokens)
    vocab = byte_tok.get_vocab_size()
    for _ in range(400):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        full = byte_tok.decode(ids, skip_special_tokens=skip_special_tokens)
        detok = IncrementalDetokenizer(chat_tok, skip_special_tokens=skip_special_tokens)
        deltas = []
        for n, token in enumerate(ids, 1):
            deltas.append(detok.add(token))
            so_far = byte_tok.decode(ids[:n], skip_special_tokens=skip_special_tokens)
            # exactly the trailing U+FFFD run (a possibly unfinished character) is held back
            assert detok.text == so_far.rstrip(REPLACEMENT) and full.startswith(detok.text)
        deltas.append(detok.flush())
        assert "".join(deltas) == full == detok.text
        assert sum(d.count(REPLACEMENT) for d in deltas) == full.count(REPLACEMENT)
        if REPLACEMENT not in full:
            assert not any(REPLACEMENT in d for d in deltas)
        assert detok.token_ids == ids


def test_real_text_emits_each_character_once_complete(chat_tok, byte_tok):
    text = "".join(LINES[:3]) + "\n混合 mixed 😀👍🏽 text"
    ids = chat_tok.encode(text)
    assert any(len(byte_tok.id_to_token(i)) == 1 and ord(byte_tok.id_to_token(i)) >= 0xA1 for i in ids), \
        "the tokenizer should split some multi-byte characters"
    detok = IncrementalDetokenizer(chat_tok)
    for n, token in enumerate(ids, 1):
        delta = detok.add(token)
        assert REPLACEMENT not in delta
        assert detok.text == complete_prefix(token_bytes(byte_tok, ids[:n]))
    assert detok.flush() == "" and detok.text == text
    batched = IncrementalDetokenizer(chat_tok)
    rng = random.Random(3)
    pieces, k = [], 0
    while k < len(ids):
        step = rng.randrange(1, 6)
        pieces.append(batched.add_many(ids[k:k + step]))
        k += step
    assert "".join(pieces) + batched.flush() == text


def test_unfinished_character_is_flushed_like_the_full_decode(chat_tok, byte_tok):
    ids = chat_tok.encode("ok 😀")
    cut = next(n for n in range(1, len(ids)) if byte_tok.decode(ids[:n]).endswith(REPLACEMENT))
    detok = IncrementalDetokenizer(chat_tok)
    head = "".join(detok.add(i) for i in ids[:cut])
    assert REPLACEMENT not in head
    assert head + detok.flush() == byte_tok.decode(ids[:cut])


def test_context_dependent_decoder_with_prompt_context():
    """Metaspace drops the leading space of the first token only: the window keeps the previous
    emission (or the prompt's last tokens) as context so deltas still concatenate correctly."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(LINES, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"], show_progress=False))
    rng = random.Random(8)
    vocab = tok.get_vocab_size()
    for _ in range(300):
        ids = [rng.randrange(1, vocab) for _ in range(rng.randrange(1, 20))]
        assert "".join(run(IncrementalDetokenizer(tok), ids)) == tok.decode(ids)
        prompt = [rng.randrange(1, vocab) for _ in range(rng.randrange(1, 8))]
        with_context = "".join(run(IncrementalDetokenizer(tok, context_ids=prompt), ids))
        assert with_context == tok.decode(prompt + ids)[len(tok.decode(prompt)):]


def test_tokens_to_detok_to_streaming_parser(chat_tok):
    """End to end: completion tokens -> detokenizer deltas -> streaming parser equals the strict parse."""
    prompts = _official_prompts()
    completion = prompts[0].split(ASSISTANT + THINK_OPEN)[1].split(USER)[0]   # reasoning + DSML call + EOS
    expected = parse_completion(completion, "thinking", strict=True)
    detok, parser, events = IncrementalDetokenizer(chat_tok), StreamingParser("thinking"), []
    for token in chat_tok.encode(completion):
        events += parser.feed(detok.add(token))
    events += parser.feed(detok.flush()) + parser.finish()
    got = parser.result()
    assert (got["reasoning_content"], got["content"]) == (expected["reasoning_content"], expected["content"])
    assert [c["function"] for c in got["tool_calls"]] == [c["function"] for c in expected["tool_calls"]]
    assert sum(1 for e in events if "tool_calls" in e) == 1
