"""Drives a model over the engine's paged pools without the scheduler: sequences of different
lengths prefilled, then decode steps over a changing subset of them with one rollback (tests of
dsv4.engine.paged_decode on CPU and GPU)."""
from __future__ import annotations

import torch

from dsv4.engine.cache import CacheConfig, HybridCache
from dsv4.engine.sequence import Sequence
from dsv4.model import ForwardContext, set_forward_context

PROMPTS = (3, 130, 7, 262, 1, 40, 127)  # around the window (16), ratio 4 and ratio 128 boundaries


class PagedBatch:
    """Sequences over a HybridCache, driven without the scheduler."""

    def __init__(self, model, kv_dtype: str, prompts=PROMPTS, together: bool = False):
        """`together`: the prompts prefilled in one forward (its logits: `prefill_logits`), else one forward each."""
        self.model, self.device = model, model.embed.weight.device
        cfg = model.config
        self.cache = HybridCache(cfg, CacheConfig.for_capacity(cfg, max_num_seqs=len(prompts), max_model_len=512,
                                                               kv_dtype=kv_dtype), dtype=model.dtype,
                                 device=model.embed.weight.device)
        self.seqs = [Sequence(f"r{i}", [1]) for i in range(len(prompts))]
        self.states = [self.cache.state_of(s) for s in self.seqs]
        ids = [torch.randint(2, 500, (n,), generator=torch.Generator().manual_seed(n)) for n in prompts]
        with torch.no_grad():
            if together:
                self.prefill_logits = self.forward(self.seqs, torch.cat(ids), list(prompts))
            else:
                for seq, t in zip(self.seqs, ids):
                    self.forward([seq], t)

    def forward(self, seqs, ids, lens=None):
        lens = lens or [ids.shape[0] // len(seqs)] * len(seqs)
        states = [self.cache.reserve(s, n) for s, n in zip(seqs, lens)]
        pos = torch.cat([torch.arange(st.num_tokens, st.num_tokens + n) for st, n in zip(states, lens)])
        with set_forward_context(ForwardContext(lens, states)):
            return self.model.compute_logits(self.model(ids.to(self.device), pos.to(self.device))).float().cpu()

    def decode(self, steps: int, seed: int = 0):
        """`steps` decode steps over a changing subset of the sequences; a rollback of 2 tokens of
        sequence 1 (if any) after step 5, re-decoded as a 2-token chunk; every 7th step an MTP-verify-like
        step where the sequences bring 1-4 tokens each, then a rollback of 1 token of every sequence."""
        gen, out = torch.Generator().manual_seed(seed), []
        with torch.no_grad():
            for step in range(steps):
                live = [s for i, s in enumerate(self.seqs) if step < 4 or i % 3 != 2]
                lens = [1 + (i + step) % 4 for i in range(len(live))] if step % 7 == 6 else [1] * len(live)
                out.append(self.forward(live, torch.randint(2, 500, (sum(lens),), generator=gen), lens))
                if step % 7 == 6:
                    for s in live:
                        self.cache.state_of(s).truncate(1)
                        s.num_computed_tokens -= 1
                if step == 5 and len(self.seqs) > 1:
                    self.cache.state_of(self.seqs[1]).truncate(2)
                    self.seqs[1].num_computed_tokens -= 2
                    out.append(self.forward([self.seqs[1]], torch.randint(2, 500, (2,), generator=gen)))
        return out
