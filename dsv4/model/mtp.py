"""Multi-token-prediction block `mtp.0` (spec §2.11).

    e  = enorm(embed[next_token])                      [T, D]
    X0 = h_proj(hnorm(X_j)) + e_proj(e)   per stream j  [T, hc, D]   (X = main model's pre-hc_head residual)
    X1 = Block_mtp(X0)                                  sliding-only attention (theta 10000), top-k MoE
    hidden = norm(hc_head_mtp(X1)),  logits = head(hidden)   (embed and head shared with the main model)

Pairing (spec: uncertain, standard DeepSeek MTP): the row for position t combines X_t with the
embedding of token t+1, attends at position t through the MTP block's own window state
(`SequenceState.mtp`), and predicts token t+2. No position-0 embedding mask is applied. Chained
drafts feed the returned residual back in as `prev_residual`.
"""
from __future__ import annotations

import torch
from torch import nn

from dsv4.config import ModelConfig
from dsv4.model.block import Block
from dsv4.model.context import (ForwardContext, Segment, advance_paged, check_token_ids, get_forward_context,
                                paged_step_pools, sequence_spans)
from dsv4.model.hyper import hc_head
from dsv4.model.linear import FP8, Linear
from dsv4.model.mixed_steps import split_mixed_mtp
from dsv4.model.norm import RMSNorm
from dsv4.model.numerics import Numerics, acc_dtype
from dsv4.model.state import SequenceState


class MTPBlock(Block):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, numerics: Numerics,
                 embed: nn.Module, head: nn.Module, layout=None):
        super().__init__(config, config.mtp_layer, dtype, numerics, layout)
        self.layout = layout
        d, hc, acc = config.hidden_size, config.hc_mult, acc_dtype(dtype)
        self.config, self.dtype, self.hc_mult = config, dtype, hc
        self.ready = False  # set by the model once all mtp.0.* tensors are loaded
        self.e_proj = Linear(d, d, dtype, numerics, FP8)
        self.h_proj = Linear(d, d, dtype, numerics, FP8)
        self.enorm = RMSNorm(d, config.rms_norm_eps, dtype)
        self.hnorm = RMSNorm(d, config.rms_norm_eps, dtype)
        self.norm = RMSNorm(d, config.rms_norm_eps, dtype)
        self.hc_head_fn = nn.Parameter(torch.empty(hc, hc * d, dtype=acc), requires_grad=False)
        self.hc_head_base = nn.Parameter(torch.empty(hc, dtype=acc), requires_grad=False)
        self.hc_head_scale = nn.Parameter(torch.empty(1, dtype=acc), requires_grad=False)
        # The main model's embed and head, shared; a plain tuple so they are not registered twice.
        self._shared = (embed, head)

    def forward(self, prev_residual: torch.Tensor, next_token_ids: torch.Tensor,
                positions: torch.Tensor, graphs=None) -> tuple[torch.Tensor, torch.Tensor]:
        """prev_residual [T, hc*D], next_token_ids [T], positions [T] -> (residual [T, hc*D], hidden [T, D]).

        Sequences and states come from the forward context (`state.mtp` of each sequence); without
        one the rows are one fresh sequence from position 0. Logits: `compute_logits(hidden)`.
        `graphs` (the model's dsv4.model.graphs.DecodeGraphs): draft rows over the engine's pools
        replay a captured step instead of running eagerly."""
        if not self.ready:
            raise RuntimeError("MTP weights are not loaded (load_mtp_weights + finalize_weights)")
        t, width = prev_residual.shape[0], self.hc_mult * self.config.hidden_size
        if prev_residual.shape != (t, width) or next_token_ids.shape != (t,) or positions.shape != (t,):
            raise ValueError(f"MTP forward: expected prev_residual [T, {width}], next_token_ids [T], positions [T]; "
                             f"got {tuple(prev_residual.shape)}, {tuple(next_token_ids.shape)}, "
                             f"{tuple(positions.shape)}")
        positions, next_token_ids = positions.long(), next_token_ids.long()
        ctx = get_forward_context()
        check_token_ids(next_token_ids, self.config.vocab_size, "MTP next_token_ids",
                        trusted=ctx is not None and ctx.trusted_inputs)
        if ctx is None:
            ctx = ForwardContext([t], [SequenceState.create(self.config, self.dtype, prev_residual.device)])
        if any(s.mtp is None or s.dtype != self.dtype for s in ctx.states):
            raise ValueError("a SequenceState in the forward context has no MTP state or another dtype")
        spans = sequence_spans(ctx, positions, [s.mtp.num_tokens for s in ctx.states])
        segments = [Segment(start, n, s.mtp) for (start, n), s in zip(spans, ctx.states) if n]
        pools = paged_step_pools(ctx)
        if pools is None:
            out = None
            if graphs is not None:  # decode rows beside chunks: two calls (mixed_steps); else a short prefill's
                out = split_mixed_mtp(self, prev_residual, next_token_ids, positions, ctx, spans, graphs)
                if out is None and graphs.handles_prefill(ctx.seq_lens):  # rows as pieces (None: did not fit)
                    out = graphs.mtp_prefill(prev_residual, next_token_ids, positions, segments)
            return out if out is not None else self.compute(prev_residual, next_token_ids, positions, segments)
        lens = [int(n) for n in ctx.seq_lens]  # draft rows over the engine's pools: the fixed-shape step
        if graphs is not None and t <= graphs.max_batch:
            out = graphs.paged_mtp_step(pools, self, prev_residual, next_token_ids, ctx.states, lens)
        else:
            step = pools.decode_step(t, max(s.mtp.num_tokens + n for s, n in zip(ctx.states, lens)))
            step.fill(ctx.states, lens, mtp=True)
            step.derive()
            out = self.compute(prev_residual, next_token_ids, step.pos, None, step=step)
        advance_paged(ctx.states, lens, mtp=True)
        return out

    def compute(self, prev_residual: torch.Tensor, next_token_ids: torch.Tensor, positions: torch.Tensor,
                segments: list[Segment] | None, step=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's math on checked inputs: per-sequence `segments`, or a derived fixed-shape `step`."""
        x = super().forward(self.mix_inputs(prev_residual, next_token_ids), None, positions, segments, step=step)
        return x.flatten(1), self.head(x)

    def mix_inputs(self, prev_residual: torch.Tensor, next_token_ids: torch.Tensor) -> torch.Tensor:
        """The block's input streams [T, hc, D]: h_proj(hnorm(X_j)) + e_proj(enorm(embed(next token)))."""
        embed, _ = self._shared
        x = prev_residual.to(self.dtype).unflatten(-1, (self.hc_mult, -1))
        acc = acc_dtype(self.dtype)
        e = self.e_proj(self.enorm(embed(next_token_ids, validate=False)))
        h = self.h_proj(self.hnorm(x).flatten(0, 1)).unflatten(0, x.shape[:2])
        return (h.to(acc) + e.to(acc).unsqueeze(1)).to(self.dtype)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, D] from the block's output streams: its HC head, then its final norm."""
        return self.norm(hc_head(x, self.hc_head_fn, self.hc_head_base, self.hc_head_scale,
                                 hc_eps=self.hc_kwargs["hc_eps"], norm_eps=self.hc_kwargs["norm_eps"]))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits through the shared head, fp32 (fp64 for a float64 model)."""
        from dsv4.model.deepseek_v4 import lm_head
        return lm_head(hidden, self._shared[1], self.layout)
