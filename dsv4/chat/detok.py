"""Streaming detokenization that only ever emits complete UTF-8 text.

Public API
----------
IncrementalDetokenizer(tokenizer, *, skip_special_tokens=False, context_ids=())
    .add(token_id) -> str          text made final by this token ("" while it is held back)
    .add_many(token_ids) -> str    same for several tokens at once
    .flush() -> str                the held-back rest, call once at the end of the sequence
    .text -> str                   everything emitted so far
    .token_ids -> list[int]        the generated ids (context excluded)

`tokenizer` is anything with `decode(ids, skip_special_tokens=...)` (ChatTokenizer or a
`tokenizers.Tokenizer`). A byte-level BPE token may end in the middle of a multi-byte character;
decoding then yields U+FFFD at the end. Such a trailing U+FFFD run is held back until a later token
completes the character (everything before it is emitted at once), so the deltas concatenate to
exactly `decode(all ids)` and never contain a U+FFFD that the full decode does not have.

Only a short window is re-decoded per step: the tokens since the last emission plus the tokens of
the previous emission (`prefix`), whose text is subtracted. Starting the window at an earlier
emission boundary keeps decoders that look at neighbouring tokens (leading-space handling) right;
`context_ids` (e.g. the last prompt tokens) seed that window and are never emitted.
"""
from __future__ import annotations

from typing import Iterable, Protocol

REPLACEMENT = "\ufffd"
_CONTEXT_WINDOW = 4


class _Decoder(Protocol):
    def decode(self, ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: _Decoder, *, skip_special_tokens: bool = False,
                 context_ids: Iterable[int] = ()):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        context = list(context_ids)[-_CONTEXT_WINDOW:]
        self._n_context = len(context)
        self._ids = context
        self._prefix = 0               # window start: first token of the previous emission
        self._read = len(context)      # tokens before this one are emitted (or context)
        self._partial = 0              # characters of the current window emitted beyond the prefix
        self.text = ""

    @property
    def token_ids(self) -> list[int]:
        return self._ids[self._n_context:]

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def _step(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        window_text = self._decode(self._ids[self._prefix:])
        start = len(prefix_text) + self._partial
        if window_text.endswith(REPLACEMENT) and not final:
            # Possibly an unfinished character: emit only what precedes the trailing U+FFFD run;
            # text before a complete character cannot change when more bytes arrive.
            end = len(window_text.rstrip(REPLACEMENT))
            delta = window_text[start:end] if end > start else ""
            self._partial += len(delta)
        else:
            delta = window_text[start:]
            if len(window_text) > len(prefix_text):
                self._prefix, self._read, self._partial = self._read, len(self._ids), 0
        self.text += delta
        return delta

    def add(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        return self._step(final=False)

    def add_many(self, token_ids: Iterable[int]) -> str:
        self._ids.extend(int(t) for t in token_ids)
        return self._step(final=False)

    def flush(self) -> str:
        return self._step(final=True)
