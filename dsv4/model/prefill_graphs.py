"""Short prefill forwards under piecewise CUDA graphs: the layers' stateless parts captured, their attention eager.
This module holds the policy (which forwards, which buckets); the pieces are `dsv4.model.piecewise.PiecewiseBucket`,
which the piecewise decode steps over contiguous states use too.

Why: an eager forward of a few hundred tokens is bound by the host, not the GPU. Session 60 (H100, 8 Flash layers,
one fresh prompt): 128 tokens took 62-72 ms of wall time for 17 ms of GPU work, the GPU idle before 613 of its 698
kernels; the host spends ≈ 8 ms per layer in Python and launches. Decode steps are whole graphs
(dsv4.model.graphs), but a prefill chunk's attention writes each sequence's state with sizes that change every
step. So a forward of T tokens (any mix of sequences' chunks, up to PREFILL_MAX_TOKENS) is cut as the piecewise
decode graphs cut it:

    piece 0      embed -> layer 0 `pre`                       (captured)
    attend 0     layer 0 attention over the sequences' chunks (eager: `Attention.attend` with the segments)
    piece i      layer i-1 `post` -> layer i `pre`            (captured)
    ...
    piece L      layer L-1 `post` -> HC head + final norm     (captured)

one set of graphs per token bucket (PREFILL_BUCKETS: T padded with token 0 at position 0; `pre` and `post` are
per token, and `attend` reads and writes only the real rows, so padding rows touch no state and no real row).

Memory: each piece copies what crosses to the next step into static buffers shared by the layers: what the next
piece reads while it writes its own (the residual streams, the mHC post / comb, the RoPE tables `finish` needs) one
per layer parity, what only the eager attention in between reads (q, kv, the compressor and indexer rows) one for
all, plus one attention output buffer: ≈ 0.24 MB per token for Flash, whatever the depth. The buckets share them too
(`piecewise.StaticArena`: a bucket of T tokens uses the first T rows), so they take the largest bucket's memory
(464 MiB at 2048 tokens for Flash) rather than the sum over the buckets. What a piece allocates inside its graph is
transient, so every piece may capture into the decode graphs' shared pool (each replay's results are copied out
before the next graph replays). Results equal the eager forward at the bucket's size bit for bit (the same kernels
on the same rows); a padded forward may pick other GEMM shapes (cuBLAS from 256 rows) than the unpadded eager one.

Out of GPU memory while a bucket is captured (its warm-up or its graphs; no state is touched before the forward's
first piece), a single GPU drops every bucket and lowers its limit (`DecodeGraphs.prefill_limit`) by a bucket:
those forwards run eagerly, and the buckets below are made again with buffers for the new largest.

A sharded model (TP/EP ranks in lock-step: every rank the same batch, so the same bucket) runs the pieces too, their
collectives inside the captured pieces as in the paged step graphs (`_capture(sharded=True)`). Ranks capture only when
`--cuda-graphs` is given, and that capture has not run on two GPUs yet; the plumbing is CPU-tested on gloo ranks
(tests/test_distributed.py, `capture=False`).
"""
from __future__ import annotations

PREFILL_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
# Forwards of up to this many tokens run as prefill pieces (0: never). Session 60 (H100, 8 Flash layers, one fresh
# prompt; bench/bench_prefill_graphs.py): eager / pieces 43.3 / 12.8 ms at 16 tokens, 48.0 / 13.8 at 64, 56.6 / 18.3
# at 128, 54.4 / 22.7 at 256. Session 61 (H100): 42.2 / 26.2 ms at 1024, 46.3 / 34.1 at 1536 (bucket 2048), 43.5 /
# 33.5 at 2048; the 2048 bucket costs 232 MiB more static buffers (464 MiB in all, docs/benchmarks.md).
PREFILL_MAX_TOKENS = 2048


def max_prefill_tokens(limit: int | None = None) -> int:
    """The most tokens a forward may bring to run as pieces: PREFILL_MAX_TOKENS, or `limit` where lower (a model's
    `DecodeGraphs.prefill_limit`: the engine's `prefill_graph_tokens`, or lowered once a bucket did not fit)."""
    return PREFILL_MAX_TOKENS if limit is None else min(limit, PREFILL_MAX_TOKENS)


def prefill_bucket_size(tokens: int, limit: int | None = None) -> int | None:
    """The bucket a forward of `tokens` tokens runs in, or None (eager); `limit` as in `max_prefill_tokens`."""
    if not 0 < tokens <= max_prefill_tokens(limit):
        return None
    return next((b for b in PREFILL_BUCKETS if b >= tokens), None)


def prefill_bucket_sizes(limit: int | None = None) -> list[int]:
    """Every bucket a forward may run in (the one that holds PREFILL_MAX_TOKENS, or `limit`, included)."""
    top = max_prefill_tokens(limit)
    return sorted({prefill_bucket_size(min(b, top), limit) for b in PREFILL_BUCKETS} - {None})
