"""Structured outputs: a grammar (a JSON schema, any JSON object, a regex, a list of choices or a Lark grammar)
decides which tokens a request may sample next.

llguidance (the grammar engine vLLM and llama.cpp use) turns the grammar and the tokenizer into a matcher per
sequence: its token mask holds the tokens that keep the output a prefix of the grammar's language (the EOS
tokens once the output is complete). The sampler sets every other token's logit to -inf after bias and
penalties, so greedy, sampled and speculative rows all draw from the constrained distribution.

    StructuredOutput(json=schema) | (json_object=True) | (regex=...) | (choice=[...]) | (grammar=lark)
    Grammars(tokenizer, vocab_size, eos_ids).state(so) -> GrammarState   (ValueError for a bad grammar)
    GrammarState.advance(output_ids)        consume the tokens emitted since the last call
    GrammarState.mask(drafted)              the int32 bitmask words after the output and `drafted`
    apply_grammar_masks(logits, masks)      -inf where a row's mask bit is 0

`start_after`: with a reasoning block (the chat's thinking mode) the grammar applies only after the token that
closes it, so the model thinks freely and answers in the format.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence as Seq

import numpy as np
import torch

from dsv4.kernels._triton import HAS_TRITON
from dsv4.kernels.token_mask import apply_token_masks, apply_token_masks_ref
from dsv4.model.context import to_device

log = logging.getLogger(__name__)

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# JSON laid out as json.dumps does (", " and ": ", no other whitespace): with flexible whitespace a model can pad
# forever inside an object and never close it; a schema's own "x-guidance" options override these
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_CHOICES = 1024
COMPILED_GRAMMARS = 256  # compiled matchers kept for grammars that come again (the same schema on every request)


def _llguidance():
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a declared dependency; the message says what to install
        raise ValueError("structured outputs need the llguidance package (pip install llguidance)") from None
    return llguidance


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one of json (a JSON schema: dict or its text), json_object, regex, choice or grammar (Lark, in
    llguidance's dialect)."""
    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    start_after: int | None = None  # constrain only the tokens after this token id (the end of a reasoning block)
    _text: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured output choice: expected a list of non-empty strings")
            if not 0 < len(self.choice) <= MAX_CHOICES:
                raise ValueError(f"structured output choice: expected 1 to {MAX_CHOICES} strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if not isinstance(self.json_object, bool):
            raise ValueError(f"structured output json_object={self.json_object!r}; expected a bool")
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured output: give exactly one of {', '.join(KINDS)} (got {given or 'none'})")
        for name in ("regex", "grammar"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"structured output {name}: expected a non-empty string")
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except json.JSONDecodeError as e:
                    raise ValueError(f"structured output json: not valid JSON ({e})") from None
            if not isinstance(schema, (dict, bool)):
                raise ValueError("structured output json: a JSON schema is an object")
            object.__setattr__(self, "_text", json.dumps(schema))
        if self.start_after is not None and (isinstance(self.start_after, bool) or not isinstance(
                self.start_after, int) or self.start_after < 0):
            raise ValueError(f"structured output start_after={self.start_after!r}; expected a token id")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def cache_key(self) -> tuple:
        """What the compiled matcher depends on (not start_after)."""
        return (self.kind, self._text or self.regex or self.grammar or self.choice or True)

    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's serialised form (not yet checked: `Grammars.state` does)."""
        matcher = _llguidance().LLMatcher
        if self.json is not None:
            return matcher.grammar_from_json_schema(self._text, defaults=JSON_LAYOUT)
        if self.json_object:
            return matcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
        if self.regex is not None:
            return matcher.grammar_from_regex(self.regex)
        if self.choice is not None:  # Lark string literals take JSON's escapes
            return matcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.choice))
        return matcher.grammar_from_lark(self.grammar)


def after_reasoning(params, think_close_id: int):
    """`params` (SamplingParams) with its grammar applying from `think_close_id` on: a chat prompt that ends inside
    the reasoning block (thinking mode) gets a free reasoning and a formatted answer. Unchanged without a grammar."""
    if params is None or params.structured is None:
        return params
    return dataclasses.replace(params, structured=dataclasses.replace(params.structured, start_after=think_close_id))


class GrammarState:
    """One sequence's matcher and how far into its output it has read."""

    def __init__(self, matcher: Any, start_after: int | None, eos_only: np.ndarray):
        self.matcher = matcher
        self.start_after = start_after
        self.armed = start_after is None
        self.num_read = 0  # output tokens advanced over
        self._eos_only = eos_only  # the mask allowing only the end (shared by every state of one `Grammars`)

    def advance(self, output_ids: Seq[int]) -> None:
        """Consume the output tokens after the last call's."""
        for t in output_ids[self.num_read:]:
            if self.armed:
                self.matcher.consume_token(t)  # a refused token leaves the matcher in its error state
            elif t == self.start_after:
                self.armed = True
        self.num_read = len(output_ids)

    def _mask(self) -> np.ndarray:
        if self.matcher.is_error():  # nothing can continue the output: only the end
            return self._eos_only
        return self._or_end(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.int32)[: self._eos_only.size])

    def _or_end(self, mask: np.ndarray) -> np.ndarray:
        """`mask`, or the end alone where it allows nothing (a vocabulary that cannot spell what the grammar
        needs)."""
        return mask if mask.any() else self._eos_only

    def mask(self, drafted: Seq[int] = ()) -> np.ndarray | None:
        """The mask after the output read so far and `drafted` (e.g. speculative drafts); None where nothing is
        constrained yet, or where `drafted` itself breaks the grammar (no token is sampled there: the draft before
        it is refused)."""
        armed, take = self.armed, []
        for t in drafted:
            if armed:
                take.append(t)
            elif t == self.start_after:
                armed = True
        if not armed:
            return None
        taken = self.matcher.try_consume_tokens(take) if take else 0
        mask = self._mask() if taken == len(take) else None
        if taken:
            self.matcher.rollback(taken)
        return mask


class Grammars:
    """Matchers for one tokenizer: the tokenizer's llguidance form (llguidance's docs: about a second to build for
    a large vocabulary) is built once, at the engine's start (`prepare`), and shared by every request."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Seq[int]):
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, vocab_size, list(eos_ids)
        self._lltok = None
        self._compiled: OrderedDict = OrderedDict()  # StructuredOutput.cache_key -> a matcher never advanced
        # int32 words of one mask: what llguidance's batched fill expects (llguidance.torch.get_bitmask_shape); a
        # single matcher's compute_bitmask may give one word more, past the vocabulary, which is cut
        self.words = (vocab_size + 31) // 32
        self._eos_only = np.zeros(self.words, dtype=np.int32)
        for t in self.eos_ids:
            self._eos_only.view(np.uint32)[t // 32] |= np.uint32(1 << (t % 32))

    def prepare(self) -> None:
        """Build the tokenizer's llguidance form now (the engine's start), not inside the first structured request's
        admission, where it would hold up every running request's next step. A problem is logged here and raised
        to the structured requests when they come."""
        if self.tokenizer is not None:
            try:
                self._llguidance_tokenizer()
            except ValueError as e:
                log.warning("structured outputs unavailable: %s", e)

    def _llguidance_tokenizer(self):
        if self._lltok is None:
            ll = _llguidance()
            try:
                self._lltok = ll.LLTokenizer(self.tokenizer.to_json(), n_vocab=self.vocab_size, eos_token=self.eos_ids)
            except Exception as e:  # the Rust side's own exception types
                raise ValueError(f"llguidance cannot read the tokenizer ({type(e).__name__}: {e})") from None
        return self._lltok

    def state(self, so: StructuredOutput) -> GrammarState:
        """A fresh matcher for `so`; ValueError naming the problem when the grammar is invalid. A grammar seen
        lately is copied from its compiled matcher (µs) instead of compiled again (ms: checked, lexer built)."""
        if self.tokenizer is None:
            raise ValueError("structured outputs need the checkpoint's tokenizer, and this model has none")
        key = so.cache_key
        compiled = self._compiled.pop(key, None)
        if compiled is None:
            compiled = self._compile(so)
        self._compiled[key] = compiled  # most recently used last
        while len(self._compiled) > COMPILED_GRAMMARS:
            self._compiled.pop(next(iter(self._compiled)))
        return GrammarState(compiled.deep_copy(), so.start_after, self._eos_only)

    def _compile(self, so: StructuredOutput):
        ll, lltok = _llguidance(), self._llguidance_tokenizer()
        try:
            grammar = so.llguidance_grammar()
            problem = ll.LLMatcher.validate_grammar(grammar, lltok)
            matcher = None if problem else ll.LLMatcher(lltok, grammar, log_level=0)
            if matcher is not None and matcher.is_error():
                problem = matcher.get_error()
        except BaseException as e:  # pyo3 reports a panic of the Rust side as a BaseException: a bad grammar too
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            problem = f"{type(e).__name__}: {e}"
        if problem:
            raise ValueError(f"structured output {so.kind}: {problem.strip()}")
        return matcher


_EXECUTOR = None


def _executor():
    """llguidance's thread pool for masks of many rows at once (it releases the GIL; ≈ 80 % of the CPUs)."""
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = _llguidance().LLExecutor()
    return _EXECUTOR


def grammar_masks(seqs: Seq, drafted: Seq[Seq[int]] | None = None) -> list[np.ndarray | None] | None:
    """Row i's mask (seqs[i] after its output and drafted[i]); None when no row has a grammar. Rows without drafts
    whose grammar is live are computed together on llguidance's threads: a mask walks the whole vocabulary, and
    one row after another the host's time would grow with the batch (bench/bench_structured.py)."""
    if all(getattr(s, "grammar", None) is None for s in seqs):
        return None
    drafted = drafted if drafted is not None else [()] * len(seqs)
    out: list[np.ndarray | None] = [None] * len(seqs)
    live = []
    for i, (s, d) in enumerate(zip(seqs, drafted)):
        g = s.grammar
        if g is None:
            continue
        if not d and g.armed and not g.matcher.is_error():
            live.append((i, g))
        else:
            out[i] = g.mask(d)
    if len(live) == 1:
        i, g = live[0]
        out[i] = g.mask()
    elif live:
        words = live[0][1]._eos_only.size
        buf = np.empty((len(live), words), dtype=np.int32)
        _executor().unsafe_compute_mask_ptr([(g.matcher, k) for k, (_, g) in enumerate(live)], buf.ctypes.data,
                                            words * 4, len(live))
        for k, (i, g) in enumerate(live):
            out[i] = g._or_end(buf[k])
    return out


def apply_grammar_masks(logits: torch.Tensor, masks: Seq[np.ndarray | None] | None) -> torch.Tensor:
    """Logits with -inf wherever a row's mask bit is 0 (a new tensor where any row has a mask, else `logits`):
    one upload of the rows' words (-1 for a row without a mask) and, on a GPU, one kernel
    (dsv4.kernels.token_mask)."""
    rows = [i for i, m in enumerate(masks or ()) if m is not None]
    if not rows:
        return logits
    words = np.full((logits.shape[0], (logits.shape[1] + 31) // 32), -1, dtype=np.int32)
    for i in rows:
        n = min(masks[i].size, words.shape[1])
        words[i, :n] = masks[i][:n]
        words[i, n:] = 0  # ids past the tokenizer's vocabulary are never allowed
    words = to_device(torch.from_numpy(words), logits.device)  # pinned, not waited for
    if logits.device.type == "cuda" and HAS_TRITON:
        return apply_token_masks(logits, words)
    return apply_token_masks_ref(logits, words)
