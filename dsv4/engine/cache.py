"""Hybrid decode cache of the engine: page accounting + per-sequence model state + the model call.

DeepSeek-V4 keeps several kinds of per-sequence state (spec deepseek_v4_model.md §3): the sliding
window ring, compressed entries (ratio 4 and 128), indexer keys and the compressors' open windows.
`BlockManager` accounts them in fixed-size pages per kind, so capacity is known up front and the
scheduler preempts when a kind runs out. The tensors live in `dsv4.engine.paged_state` pools.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..config import ModelConfig
from ..model.context import ForwardContext, set_forward_context, to_device
from .block_manager import BlockManager, make_page_kinds, required_kinds
from .sampler import token_logprobs
from .scheduler import ScheduledBatch
from .sequence import Sequence

MAX_ROLLBACK = 4  # tokens a sequence can roll back (MTP speculative decoding drafts at most 3)
PROMPT_LOGPROB_ROWS = 256  # prompt positions scored per LM-head call ([rows, vocab] fp32 logits at a time)
DEFAULT_PAGE_SIZES = {"window": 16, "compressed4": 64, "compressed128": 16, "indexer4": 64}


@dataclass
class CacheConfig:
    page_sizes: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PAGE_SIZES))
    num_pages: dict[str, int] = field(default_factory=dict)
    max_rollback: int = MAX_ROLLBACK
    kv_dtype: str = "auto"  # "auto" (model dtype) or "fp8" (nope dims e4m3 + E8M0 scales)

    @classmethod
    def for_capacity(cls, config: ModelConfig, *, max_num_seqs: int, max_model_len: int,
                     total_tokens: int | None = None, kept_states: int = 0, **kw) -> "CacheConfig":
        """Pools sized for `total_tokens` tokens of context over all sequences (default: enough for
        every sequence at a quarter of max_model_len, and at least two at full length). `kept_states`: decode
        states kept beside the running sequences' (retained sequences, prefix snapshots), each with a window ring
        and a state page of its own; their compressed entries share the token budget."""
        cfg = cls(**kw)
        if total_tokens is None:
            total_tokens = max(max_num_seqs * max_model_len // 4, 2 * max_model_len)
        ring = config.window + cfg.max_rollback
        holders = max_num_seqs + kept_states
        for name in required_kinds(config.compress_ratios):
            if name == "window":
                n = holders * math.ceil(ring / cfg.page_sizes[name])
            elif name == "state":
                n = holders
            else:
                ratio = int(name.removeprefix("compressed").removeprefix("indexer"))
                # per-holder rounding up of the last page, plus the bulk
                n = math.ceil(total_tokens / ratio / cfg.page_sizes[name]) + holders
            cfg.num_pages.setdefault(name, n)
        return cfg


class HybridCache:
    def __init__(self, config: ModelConfig, cache_config: CacheConfig, *, dtype: torch.dtype,
                 device: torch.device | str):
        self.config = config
        self.cache_config = cache_config
        self.dtype = dtype
        self.device = torch.device(device)
        ring = config.window + cache_config.max_rollback
        kinds = make_page_kinds(config.compress_ratios, ring, cache_config.page_sizes, cache_config.num_pages)
        self.block_manager = BlockManager(kinds)
        from .paged_state import PagedPools
        self.pools = PagedPools(config, self.block_manager, dtype=dtype, device=self.device,
                                max_rollback=cache_config.max_rollback, kv_dtype=cache_config.kv_dtype)
        self.states: dict[str, object] = {}

    def bytes_per_token(self) -> dict[str, float]:
        return self.pools.bytes_per_token()

    def state_of(self, seq: Sequence):
        state = self.states.get(seq.request_id)
        if state is None:
            state = self.states[seq.request_id] = self.pools.new_state(seq)
        return state

    def reserve(self, seq: Sequence, num_new_tokens: int):
        """Pages for the next `num_new_tokens` tokens of `seq`, counted as computed; its state.
        For driving the model without the scheduler (benchmarks, tests)."""
        self.block_manager.allocate(seq, num_new_tokens)
        seq.num_computed_tokens += num_new_tokens
        return self.state_of(seq)

    def release(self, seq: Sequence) -> None:
        self.states.pop(seq.request_id, None)

    @staticmethod
    def _score_prompt(model, row, hidden: torch.Tensor) -> None:
        """Append to `row.seq.prompt_logprobs` the entries of the prompt tokens this chunk predicts: position p
        scores prompt token p + 1 (the chunk's hidden rows, `hidden`, are positions row.start...). Positions
        scored before (a recompute after preemption) are skipped."""
        seq = row.seq
        todo = seq.prompt_positions_to_score(row.start, row.num_tokens)
        for a in range(todo.start, todo.stop, PROMPT_LOGPROB_ROWS):
            b = min(todo.stop, a + PROMPT_LOGPROB_ROWS)
            logits = model.compute_logits(hidden[a - row.start: b - row.start])
            seq.prompt_logprobs.extend(token_logprobs(logits, seq.token_ids[a + 1: b + 1], seq.params.prompt_logprobs))

    def run(self, model, batch: ScheduledBatch, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Forward the batch; return fp32 logits of the last token of every sampled row (speculative
        rows: of their last own token and of every draft token, 1 + len(drafts) rows). `input_ids`: a
        continuation batch's ids (one decode row each), still on the device where they were sampled."""
        if input_ids is not None:
            pos = torch.tensor([row.start for row in batch.rows], dtype=torch.long)
            states = [self.state_of(row.seq) for row in batch.rows]
            with set_forward_context(ForwardContext([1] * len(states), states, trusted_inputs=True)):
                return model.compute_logits(model.forward(input_ids, pos))
        ids, positions, lens, states, last, drafts, starts = [], [], [], [], [], [], []
        offset = 0
        for row in batch.rows:
            tokens = row.token_ids  # the chunk, then the row's draft tokens
            starts.append(offset)
            ids.extend(tokens)
            drafts.extend(range(offset + row.num_tokens, offset + len(tokens)))
            positions.extend(range(row.start, row.start + len(tokens)))
            lens.append(len(tokens))
            states.append(self.state_of(row.seq))
            offset += len(tokens)
            if row.sample:
                last.extend(range(offset - 1 - len(row.draft_token_ids), offset))
        dev = self.device
        # host tensors: the model checks them on the host and copies them without waiting for the GPU
        input_ids = torch.tensor(ids, dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)
        trusted = batch.draft_ids is not None
        if trusted:  # the drafts are argmaxes on the device; the sequences' own tokens were checked on arrival
            input_ids = to_device(input_ids, dev)
            input_ids[to_device(torch.tensor(drafts, dtype=torch.long), dev)] = batch.draft_ids
        with set_forward_context(ForwardContext(lens, states, trusted_inputs=trusted)):
            hidden = model.forward(input_ids, pos)
        for row, start in zip(batch.rows, starts):
            if row.seq.params.prompt_logprobs is not None:
                self._score_prompt(model, row, hidden[start: start + row.num_tokens])
        if not last:
            return torch.empty(0, self.config.vocab_size, dtype=torch.float32, device=dev)
        if len(last) == hidden.shape[0]:  # every row sampled (plain decode): no gather
            return model.compute_logits(hidden)
        return model.compute_logits(hidden[to_device(torch.tensor(last), dev)])
