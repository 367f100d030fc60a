"""The checkpoint's `tokenizer.json`, wrapped for the chat format (chat_encoding.md §1.1).

Public API
----------
load_tokenizer(checkpoint_dir) -> ChatTokenizer | None
    None when the directory has no tokenizer files at all; ValueError naming the file when
    `tokenizer.json` is missing (but `tokenizer_config.json` exists), unreadable or unusable.
ChatTokenizer.from_file(path) / ChatTokenizer(tokenizers.Tokenizer, source="tokenizer.json")
    .encode(text) -> list[int]      special strings recognised, no BOS added (it is in the text)
    .decode(ids, *, skip_special_tokens=False) -> str
    .token_to_id(text) -> int | None, .id_to_token(id) -> str | None, .vocab_size -> int, .to_json() -> str
    .special_ids: dict[str, int]    name -> id for every chat special string in the vocabulary
    .bos_id, .eos_id, .user_id, .assistant_id, .think_open_id, .think_close_id  (required)
    .dsml_id, .latest_reminder_id   (int | None: optional in a vocabulary)

Ids are looked up in the vocabulary at load time, never hard-coded. A chat special string must be
a single added token, otherwise rendered prompts would be split into ordinary pieces.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer

from .encoding import ASSISTANT, BOS, DSML, EOS, LATEST_REMINDER, TASK_TOKENS, THINK_CLOSE, THINK_OPEN, USER

REQUIRED_TOKENS = {"bos": BOS, "eos": EOS, "user": USER, "assistant": ASSISTANT,
                   "think_open": THINK_OPEN, "think_close": THINK_CLOSE}
OPTIONAL_TOKENS = {"dsml": DSML, "latest_reminder": LATEST_REMINDER,
                   **{f"task_{name}": text for name, text in TASK_TOKENS.items()}}


class ChatTokenizer:
    def __init__(self, tokenizer: Tokenizer, *, source: str = "tokenizer.json"):
        self._tok = tokenizer
        self.source = source
        self.special_ids: dict[str, int] = {}
        for name, text in {**REQUIRED_TOKENS, **OPTIONAL_TOKENS}.items():
            token_id = tokenizer.token_to_id(text)
            if token_id is None:
                if name in REQUIRED_TOKENS:
                    raise ValueError(f"{source}: special token {text!r} ({name}) is not in the vocabulary")
                continue
            if self.encode(text) != [token_id]:
                raise ValueError(f"{source}: {text!r} (id {token_id}) is not an added token; "
                                 "prompts would not be tokenised the way the model was trained")
            self.special_ids[name] = token_id

    @classmethod
    def from_file(cls, path: str | Path) -> "ChatTokenizer":
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: tokenizer file not found")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side raises its own exception type
            raise ValueError(f"{path}: not a valid tokenizer.json ({e})") from None
        return cls(tok, source=str(path))

    # -- ids --
    @property
    def bos_id(self) -> int:
        return self.special_ids["bos"]

    @property
    def eos_id(self) -> int:
        return self.special_ids["eos"]

    @property
    def user_id(self) -> int:
        return self.special_ids["user"]

    @property
    def assistant_id(self) -> int:
        return self.special_ids["assistant"]

    @property
    def think_open_id(self) -> int:
        return self.special_ids["think_open"]

    @property
    def think_close_id(self) -> int:
        return self.special_ids["think_close"]

    @property
    def dsml_id(self) -> int | None:
        return self.special_ids.get("dsml")

    @property
    def latest_reminder_id(self) -> int | None:
        return self.special_ids.get("latest_reminder")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    # -- text --
    def encode(self, text: str) -> list[int]:
        # add_special_tokens=False: the post-processor must not add a second BOS.
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def tokens_before(self, ids: list[int], text: str, at: int, reach: int = 16) -> int | None:
        """The most leading tokens of `ids` (the encoding of `text`) that encode no more than text[:at]: the
        largest j for which ids[j:] decode to a suffix of text at least len(text) - at long, looked for among the
        last `reach` tokens; None where none does."""
        for j in range(len(ids), max(len(ids) - 1 - reach, -1), -1):
            got = self.decode(ids[j:])
            if len(got) >= len(text) - at:
                return j if text.endswith(got) else None
        return None

    def to_json(self) -> str:
        """The tokenizer.json text (for the structured-output grammar engine)."""
        return self._tok.to_str()


def _check_config(path: Path) -> None:
    """tokenizer_config.json, when present, must name the same BOS/EOS strings the encoder emits."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: unreadable tokenizer config ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    for key, expected in (("bos_token", BOS), ("eos_token", EOS)):
        value = config.get(key)
        if isinstance(value, dict):   # AddedToken serialisation
            value = value.get("content")
        if value is not None and value != expected:
            raise ValueError(f"{path}: {key} is {value!r}, the DeepSeek-V4 format needs {expected!r}")


def load_tokenizer(checkpoint_dir: str | Path) -> ChatTokenizer | None:
    directory = Path(checkpoint_dir)
    tokenizer_json, config_json = directory / "tokenizer.json", directory / "tokenizer_config.json"
    if not tokenizer_json.exists() and not config_json.exists():
        return None
    if config_json.exists():
        _check_config(config_json)
    return ChatTokenizer.from_file(tokenizer_json)
