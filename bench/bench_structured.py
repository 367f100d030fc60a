"""What a structured-output row costs per decode step, at Flash's vocabulary size (dsv4.engine.structured).

No real DeepSeek tokenizer is available offline, so a byte-level BPE of --vocab tokens (default Flash's 129,280)
is trained on the Python sources installed here: the standard library's and the installed packages' (code and
prose, as a chat model's vocabulary holds; the standard library alone is too small for 129,280 tokens). Then:

* the tokenizer's llguidance form: build time (once per engine);
* a request's matcher: compiled (a grammar first seen) and copied (`Grammars`' cache of compiled grammars), ms;
* one row's step (`GrammarState.advance` over the new token, then its mask: llguidance caches a state's mask, so
  each timed mask is a new state's) for a JSON schema and a regex, along random valid outputs: median µs;
* B rows' steps (each row advanced, then `grammar_masks`: llguidance's thread pool) for B = 1, 8, 64: median ms;
* `apply_grammar_masks` on B rows of logits: the host's time per call (launches, the masks' pinned copy), and on
  the GPU its kernels' time (CUDA events behind a long matmul, so the host's launches are not in it);
* and, as the ceiling of the same run, a device copy of B × vocab float32 logits (what the mask rewrites).

    python bench/bench_structured.py [--vocab 129280] [--threads N]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import sys
import sysconfig
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dsv4.engine.sequence import Sequence  # noqa: E402
from dsv4.engine.structured import Grammars, StructuredOutput, apply_grammar_masks, grammar_masks  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags", "score"],
          "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
                         "score": {"type": "number"}}}


class _Tok:
    def __init__(self, tok):
        self._tok = tok

    def to_json(self) -> str:
        return self._tok.to_str()


def train_tokenizer(vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    paths = sysconfig.get_paths()
    files = sorted({f for key in ("stdlib", "purelib")
                    for f in glob.glob(os.path.join(paths[key], "**", "*.py"), recursive=True)})[:40000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                texts.append(fh.read())
        except (UnicodeDecodeError, OSError):  # a few test files are deliberately not UTF-8
            continue
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<bos>", "<eos>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok, len(texts)


def steps(grammars: Grammars, so: StructuredOutput, batch: int, reps: int, rng: random.Random) -> float:
    """Median seconds of one decode step's grammar work for `batch` rows: each row takes a random allowed token
    (not timed), then every row advances and the batch's masks are computed (timed)."""
    seqs = []
    for _ in range(batch):
        seqs.append(Sequence("b", [1]))
        seqs[-1].grammar = grammars.state(so)
    masks = grammar_masks(seqs)
    times = []
    for _ in range(reps):
        for seq, mask in zip(seqs, masks):
            allowed = [t for t in np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")) if t != 1]
            seq.token_ids.append(int(rng.choice(allowed)) if allowed else 1)
        t = time.perf_counter()
        for seq in seqs:
            seq.grammar.advance(seq.output_token_ids)
        masks = grammar_masks(seqs) if batch > 1 else [seqs[0].grammar.mask()]
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def timed(fn, reps: int) -> float:
    """The host's time per call of fn (seconds, median)."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def queued_gpu_us(fn, reps: int, big: torch.Tensor, warmup: int = 3) -> float:
    """The GPU's time per call of fn (µs, CUDA events), the calls queued behind `big @ big` (≈ 10 ms for a 16K
    square bf16) so that the host's launches do not show."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    big @ big
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    t = time.perf_counter()
    tok, nfiles = train_tokenizer(args.vocab)
    vocab = tok.get_vocab_size()
    print(f"tokenizer: byte-level BPE, {vocab} tokens from {nfiles} Python files, trained in "
          f"{time.perf_counter() - t:.1f} s; {os.cpu_count()} CPUs")
    grammars = Grammars(_Tok(tok), vocab, [1])
    t = time.perf_counter()
    grammars.prepare()
    print(f"llguidance tokenizer build: {1e3 * (time.perf_counter() - t):.0f} ms")
    rng = random.Random(0)
    kinds = {"json schema": StructuredOutput(json=SCHEMA), "regex": StructuredOutput(regex=r"[a-z ]{1,40}\.")}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"| grammar | matcher compiled (ms) | copied (ms) | one row's step: advance + mask (µs, median of "
          f"{args.reps} steps) |")
    print("|---|---|---|---|")
    for name, so in kinds.items():
        compiled = timed(lambda: grammars.state(so), 1)
        copied = timed(lambda: grammars.state(so), args.reps)
        print(f"| {name} | {1e3 * compiled:.2f} | {1e3 * copied:.3f} | "
              f"{1e6 * steps(grammars, so, 1, args.reps, rng):.0f} |")
    print(f"\n| B | B rows' step, JSON schema (ms) | apply: host (µs) | apply on {dev} (µs) | "
          f"copy of B x vocab fp32 on {dev} (µs) |")
    print("|---|---|---|---|---|")
    for batch in (1, 8, 64):
        together = steps(grammars, kinds["json schema"], batch, args.reps, rng)
        seqs = []
        for _ in range(batch):
            seqs.append(Sequence("b", [1]))
            seqs[-1].grammar = grammars.state(kinds["json schema"])
        masks = grammar_masks(seqs)
        logits = torch.randn(batch, vocab, device=dev)
        out = torch.empty_like(logits)
        host_us = 1e6 * timed(lambda: apply_grammar_masks(logits, masks), args.reps)
        if dev == "cuda":
            big = torch.randn(16384, 16384, device=dev, dtype=torch.bfloat16)
            apply_us = queued_gpu_us(lambda: apply_grammar_masks(logits, masks), args.reps, big)
            copy_us = queued_gpu_us(lambda: out.copy_(logits), args.reps, big)
        else:
            apply_us = 1e6 * timed(lambda: apply_grammar_masks(logits, masks), args.reps)
            copy_us = 1e6 * timed(lambda: out.copy_(logits), args.reps)
        print(f"| {batch} | {1e3 * together:.2f} | {host_us:.0f} | {apply_us:.0f} | {copy_us:.0f} |")
    print("\n" + json.dumps({"vocab": vocab, "device": dev, "gpu": torch.cuda.get_device_name() if dev == "cuda"
                             else None}))


if __name__ == "__main__":
    main()
