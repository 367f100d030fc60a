"""A step that mixes decode rows with prompt chunks, run as two forwards.

Decode rows are rows of 1 to max_rollback + 1 tokens over the engine's paged pools: a decode token, or a verify row
with its drafts. Alone, such rows run as one fixed-shape step, which is one CUDA graph (dsv4.model.graphs). When a
prompt chunk joins them in one step, the whole batch has so far run as one forward whose attention walks the
sequences one by one. Every decode row then pays its own few launches per layer on the host, and it does so at every
step where a prompt arrives.

With SPLIT_MIXED_STEPS, such a step runs as two forwards over the same flat batch:
  1. the decode rows as their fixed-shape step (a graph replay where graphs are on);
  2. the chunks as the usual forward (the prefill pieces up to their limit, else eager).
Their hidden states and MTP target rows are put back in batch order. The MTP block's catch-up over such a step's
rows is split the same way (`split_mixed_mtp`). The two parts touch different sequences, so
their order does not matter, and each decode row gets what a step of decode rows alone gives it.

The price is that the layers' weights are read twice in such a step, once per forward. With ONE_PASS_MIXED_STEPS
the step runs as one forward instead, over its rows reordered (the decode rows first): every stateless part (the
projections, mHC, the MoE) over all rows at once, and in each layer's attention the decode rows as one fixed-shape
paged step (`Attention.attend(head_step=)`), the chunks as usual after them -- through the prefill pieces where
their limit allows, else eagerly. By default only where the decode rows fit in the padding of the chunks' bucket
(`one_pass_fits`), where it costs no larger pieces.
"""
from __future__ import annotations

import torch

from dsv4.model.context import ForwardContext, engine_pools, set_forward_context, to_device

# H200 s63d, 8 layers, a fresh prompt of 16 / 128 / 512 tokens beside B decode rows at 4096 tokens of context:
# one forward vs split, B = 8: 45.6 / 62.8 / 63.3 -> 8.8 / 18.8 / 27.0 ms; B = 32: 243 / 252 / 254 -> 14.0 / 23.9 /
# 31.9 ms (bench/bench_prefill_graphs.py --decode-rows B)
SPLIT_MIXED_STEPS = True
# (with SPLIT_MIXED_STEPS) a mixed step as one forward, the weights read once (module docstring): True, False, or
# "same-bucket": only where the decode rows fit in the padding of the chunks' prefill-pieces bucket, so the pieces
# cost what the split's chunk forward costs and the decode step's whole weight read is saved (`one_pass_fits`).
# H100, 8 Flash layers, B decode rows at 4096 tokens of context beside a fresh prompt of P tokens, split / one pass
# (bench/bench_prefill_graphs.py --decode-rows B --one-pass): s65a, same bucket, B = 8, P = 100 / 200 / 480: 20.4 /
# 25.9 / 27.8 -> 18.7 / 24.1 / 26.3 ms (1.06-1.09x); s64a, a bucket twice as large (P = 16 / 128 / 512): B = 8
# 0.88-0.96x, B = 32 1.04-1.11x. Hence "same-bucket" on a single GPU; sharded ranks keep the split until a
# two-GPU run (`one_pass_fits`).
ONE_PASS_MIXED_STEPS: bool | str = "same-bucket"


def mixed_rows(lens: list[int], max_rollback: int) -> tuple[list[int], list[int]] | None:
    """(the decode rows, the chunks' rows) of a batch whose sequences bring `lens` tokens, when it mixes both;
    else None (also with a sequence that brings no token: the usual path takes that batch)."""
    short = [i for i, n in enumerate(lens) if 1 <= n <= max_rollback + 1]
    chunks = [i for i, n in enumerate(lens) if n > max_rollback + 1]
    if not short or not chunks or len(short) + len(chunks) != len(lens):
        return None
    return short, chunks


def _parts(ctx: ForwardContext, spans: list[tuple[int, int]]) -> list[tuple[torch.Tensor, ForwardContext]] | None:
    """(flat rows, their context) of the decode rows and of the chunks, or None (not a mixed step, or the split off).
    The caller has checked the ids and positions: the two forwards trust them."""
    pools = engine_pools(ctx) if SPLIT_MIXED_STEPS else None
    if pools is None:
        return None
    lens = [int(n) for n in ctx.seq_lens]
    parts = mixed_rows(lens, pools.max_rollback)
    if parts is None:
        return None
    return [(torch.cat([torch.arange(spans[i][0], spans[i][0] + lens[i]) for i in part]),
             ForwardContext([lens[i] for i in part], [ctx.states[i] for i in part], trusted_inputs=True))
            for part in parts]


def _run_parts(parts, total: int, run) -> list[torch.Tensor]:
    """`run(rows)` -> row tensors, per part under its context; each output put back in batch order ([total, ...])."""
    outs = None
    for rows, sub in parts:
        with set_forward_context(sub):
            got = run(rows)
        if outs is None:
            outs = [g.new_empty(total, *g.shape[1:]) for g in got]
        at = to_device(rows, got[0].device)
        for out, g in zip(outs, got):
            out[at] = g
    return outs


def split_mixed_step(model, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                     spans: list[tuple[int, int]]) -> torch.Tensor | None:
    """Hidden states [T, D] of a mixed step as two forwards (module docstring), the model's MTP target rows set
    in batch order; None when the batch is not such a mix, or SPLIT_MIXED_STEPS is off (the caller goes on)."""
    parts = _parts(ctx, spans)
    if parts is None:
        return None

    def run(rows):
        ids, pos = input_ids[to_device(rows, input_ids.device)], positions[to_device(rows, positions.device)]
        return model.forward(ids, pos), model.get_mtp_target_hidden_states()

    if one_pass(model, parts):  # one part: the decode rows first, then the chunks
        (head, head_ctx), (chunks, chunks_ctx) = parts
        parts = [(torch.cat((head, chunks)), ForwardContext(
            head_ctx.seq_lens + chunks_ctx.seq_lens, head_ctx.states + chunks_ctx.states, trusted_inputs=True,
            decode_head=len(head_ctx.states)))]
    hidden, model._mtp_target = _run_parts(parts, positions.shape[0], run)
    return hidden


def one_pass(model, parts) -> bool:
    """Whether a mixed step's (decode rows, chunks) `parts` run as one forward (ONE_PASS_MIXED_STEPS)."""
    if ONE_PASS_MIXED_STEPS == "same-bucket":
        return one_pass_fits(model, len(parts[0][0]), len(parts[1][0]))
    if ONE_PASS_MIXED_STEPS not in (True, False):
        raise ValueError("mixed_steps.ONE_PASS_MIXED_STEPS: True, False or 'same-bucket', "
                         f"got {ONE_PASS_MIXED_STEPS!r}")
    return ONE_PASS_MIXED_STEPS


def one_pass_fits(model, decode_rows: int, chunk_rows: int) -> bool:
    """Whether `decode_rows` beside `chunk_rows` of prompt chunks run in the prefill-pieces bucket the chunks alone
    run in (the model's graphs on, both within their limit; not on sharded ranks: not yet run on two GPUs)."""
    from dsv4.model.prefill_graphs import prefill_bucket_size
    graphs = model._graphs
    if graphs is None or graphs.sharded:
        return False
    alone = prefill_bucket_size(chunk_rows, graphs.prefill_limit)
    return alone is not None and prefill_bucket_size(decode_rows + chunk_rows, graphs.prefill_limit) == alone


def decode_head_step(model, ctx: ForwardContext):
    """The filled fixed-shape step (dsv4.engine.paged_decode.DecodeStep) of a one-pass mixed step's decode rows,
    those of `ctx`'s first `decode_head` sequences; one per (rows, context bucket), kept by the model's graphs."""
    from dsv4.model.graphs import context_bucket
    pools, k = engine_pools(ctx), ctx.decode_head
    states, lens = ctx.states[:k], [int(n) for n in ctx.seq_lens[:k]]
    key = (pools, sum(lens), context_bucket([s.num_tokens + n for s, n in zip(states, lens)]))
    kept = model._graphs.head_steps if model._graphs is not None else {}
    step = kept.get(key)
    if step is None:
        step = kept[key] = pools.decode_step(*key[1:])
    step.fill(states, lens)
    step.derive()
    return step


def split_mixed_mtp(block, prev_residual: torch.Tensor, next_token_ids: torch.Tensor, positions: torch.Tensor,
                    ctx: ForwardContext, spans: list[tuple[int, int]], graphs) -> tuple[torch.Tensor, ...] | None:
    """The MTP block's (residual, hidden) over a mixed step's rows (the speculator's catch-up) as two calls: the
    decode rows as its fixed-shape step, the chunks' rows as its pieces or eagerly; None as `split_mixed_step`."""
    parts = _parts(ctx, spans)
    if parts is None:
        return None

    def run(rows):
        prev, ids, pos = (t[to_device(rows, t.device)] for t in (prev_residual, next_token_ids, positions))
        return block.forward(prev, ids, pos, graphs=graphs)

    return tuple(_run_parts(parts, positions.shape[0], run))


def attend_head(attn, pre, step, out: torch.Tensor, rotate: bool) -> None:
    """`Attention.attend(head_step=)`: a one-pass mixed step's decode rows (the first `step.size` of `pre`, an
    AttentionInputs) through `attn`'s paged decode step, into out's first rows, the inverse RoPE applied iff `rotate`
    (as the chunks' attention after them applies it: `finish` treats every row alike)."""
    n = step.size
    head = pre._replace(**{f: _first_rows(getattr(pre, f), n) for f in _ROW_FIELDS})
    kernel = attn.step_kernel(step)
    if not kernel:  # (the step kernel norms q itself where `prepare` left it: q_norm_eps)
        head = attn._normed_q(head)
    attn._attend_step(head, step, out[:n], rotate=rotate)
    if rotate and not kernel:
        from dsv4.kernels.norm_rope import norm_rope
        out[:n] = norm_rope(out[:n], cos=head.cos, sin=head.sin, inverse=True)


_ROW_FIELDS = ("q", "kv", "cos", "sin", "rows", "index_rows", "index_q", "index_w")  # AttentionInputs' per-token


def _first_rows(t, n: int):
    """t's first n rows (a tuple's element-wise; None stays)."""
    if t is None:
        return None
    return tuple(v[:n] for v in t) if isinstance(t, tuple) else t[:n]
