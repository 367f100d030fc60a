"""Lightning indexer of CSA layers (spec §2.8): picks which compressed entries each query attends.

Query t: `qI = RoPE(indexer.wq_b c_q)` per head (then Hadamard + FP4 under reference numerics),
`w = weights_proj(a) * index_head_dim^-0.5 * index_n_heads^-0.5`,
`I[t, s] = sum_h w_h ReLU(qI_h . K_s)` over the visible keys s < floor((t+1)/4), and the selection
is the `min(index_topk, #visible)` largest scores. Ties are broken towards the *lowest entry index*
(a stable descending sort), so the choice never depends on how many invisible entries a batch holds.
The indexer's own compressor (d = index_head_dim) produces the keys K_s.
"""
from __future__ import annotations

import torch
from torch import nn

from dsv4.config import ModelConfig
from dsv4.model.compressor import Compressor
from dsv4.model.linear import FP8, Linear, bf16_gemm_applies, bf16_gemm_fp32
from dsv4.model.numerics import Numerics, acc_dtype, simulate_indexer_fp4
from dsv4.model import rope as rope_tables  # (`rope` is the layers' RotaryEmbedding below)
from dsv4.model.rope import RotaryEmbedding, apply_rope


QUERY_BLOCK = 256  # queries scored together (bounds the [block, heads, N] score tensor)
KERNEL_SCORES = 1 << 26  # kernel mode: scores per block of queries (128 MB of bf16 [block, N])
# kernel mode, paged decode step: the top-k picked by each row's last-arriving scores program
# (`indexer_scores.indexer_pick`) instead of a `topk_lowest_index` launch after the scores: one launch fewer per CSA
# layer and step, on the B = 1 critical path. Bit-identical on the H200 (s51), no gain: 8 Flash layers B = 1 graph
# replay 1.09 / 1.09 / 1.08 ms with it vs 1.07-1.08 without. Past 4K entries (16K context) it would also lose the
# split pick (`topk.split_slices`, session 70): its last-arriving program picks the whole row alone.
TOPK_IN_SCORES = False
# kernel mode, paged decode step: the top-k launch stores -1 for the picks that are not present (the decode attention
# kernel's index list) instead of a `where` (two launches) after it. False: the A/B
MARK_ABSENT = True


def top_k_lowest_index(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores per row; equal scores are taken in increasing index order."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def visible_entries(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """int32 count of the complete entries each position sees, (p + 1) // ratio; inside `rope.shared_cos_sin()` once
    per positions tensor (the CSA layers of a forward share it)."""
    # the entry keeps `positions` alive, so no other tensor can have its address meanwhile (views of it are new
    # objects per layer: the key is the view, not the object)
    key = ("visible", positions.data_ptr(), tuple(positions.shape), positions.stride(), ratio, positions.device)
    return rope_tables.once_per_forward(key, lambda: (positions, ((positions + 1) // ratio).to(torch.int32)))[1]


def indices_to_mask(idx: torch.Tensor, width: int) -> torch.Tensor:
    """[T, k] entry lists (-1 = none, no repeats) -> boolean mask [T, width]."""
    idx = torch.where(idx >= 0, idx.long(), width)  # -1 -> a spare column, dropped below
    mask = torch.zeros(idx.shape[0], width + 1, dtype=torch.bool, device=idx.device)
    return mask.scatter_(1, idx, True)[:, :width]


class Indexer(nn.Module):
    def __init__(self, config: ModelConfig, rope: RotaryEmbedding, dtype: torch.dtype, numerics: Numerics):
        super().__init__()
        self.n_heads, self.head_dim = config.index_n_heads, config.index_head_dim
        self.topk = config.index_topk
        self.ratio = 4
        self.rope = rope
        self.numerics = numerics
        self.weight_scale = self.head_dim ** -0.5 * self.n_heads ** -0.5
        self.use_kernels = False  # kernel mode (set at finalize): q glue in dsv4.kernels.norm_rope
        self.wq_b = Linear(config.q_lora_rank, self.n_heads * self.head_dim, dtype, numerics, FP8)
        self.weights_proj = Linear(config.hidden_size, self.n_heads, dtype, numerics)
        self.compressor = Compressor(config, self.ratio, self.head_dim, rope, dtype, numerics, kind="index")

    def query_glue(self, q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Kernel mode: wq_b's output [T, Hi*di] as heads and the `norm_rope` arguments that make it the queries
        (RoPE + Hadamard + FP4 simulation), for `queries` or for a launch shared with the attention's q."""
        from dsv4.kernels import norm_rope as nr
        sim = nr.SIM_FP4 if self.numerics.simulate_indexer_fp4 else nr.SIM_NONE
        return q.unflatten(-1, (self.n_heads, self.head_dim)), dict(cos=cos, sin=sin, sim=sim)

    def kernel_queries(self, q_latent_in: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       q: torch.Tensor | None = None) -> torch.Tensor:
        """Kernel mode: the queries [T, Hi, di] from wq_b's output `q` (computed here from q_latent_in when None),
        RoPE + Hadamard + FP4 simulation in one launch."""
        from dsv4.kernels import norm_rope as nr
        heads, kw = self.query_glue(self.wq_b(q_latent_in, input_ready=True) if q is None else q, cos, sin)
        return nr.norm_rope(heads, **kw)

    def queries(self, q_latent_in: torch.Tensor, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                weights: torch.Tensor | None = None, q: torch.Tensor | None = None, ready: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(indexer queries [T, Hi, di], head weights [T, Hi]) of a flat batch; q_latent_in is the
        (already activation-quantised) input of wq_b. `weights`: the head weights when already computed
        (kernel mode: by the layer's fused projection of `a`, see `Attention.fused_input_weight`); `q`:
        wq_b's output [T, Hi*di] when already computed (kernel mode: the layer's stacked
        wq_b | indexer.wq_b GEMM, see `Attention.fuse_fp8_pairs`); `ready`: the queries themselves when already
        computed (kernel mode: in the attention q's launch, attention.PAIRED_NORMS)."""
        if ready is not None:
            q = ready
        elif self.use_kernels:
            q = self.kernel_queries(q_latent_in, cos, sin, q)
        else:
            if q is None:
                q = self.wq_b(q_latent_in, input_ready=True)
            q = q.unflatten(-1, (self.n_heads, self.head_dim))
            q = apply_rope(q, cos[:, None], sin[:, None])
            if self.numerics.simulate_indexer_fp4:
                q = simulate_indexer_fp4(q)
        if weights is None:
            weights = self.weights_proj(a) * self.weight_scale
        return q, weights

    def select_padded(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                      present: torch.Tensor) -> torch.Tensor:
        """Decode batch, one query per sequence: q [B, Hi, di], weights [B, Hi], keys [B, N, di] padded,
        present [B, N] (a sequence's keys, all visible to its new token) -> mask [B, N]. Same
        scores, ties and top-k as `select` on each sequence alone; padding is never picked."""
        picked = top_k_lowest_index(self._scores_padded(q, weights, keys, present), min(self.topk, keys.shape[1]))
        mask = torch.zeros_like(present)
        return mask.scatter_(1, picked, present.gather(1, picked))

    def pick_padded(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                    present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`select_padded` as a list: (entry indices [B, K] ascending, which are real picks [B, K]),
        K = min(index_topk, N) -- what a kernel gathers instead of masking all N entries."""
        return self._pick(self._scores_padded(q, weights, keys, present), present)

    def pick_from_pool(self, q: torch.Tensor, weights: torch.Tensor, pool, page: torch.Tensor, off: torch.Tensor,
                       present: torch.Tensor) -> torch.Tensor:
        """The entry indices [B, K] `pick_padded` picks, ascending, -1 where not a real pick (the decode attention
        kernel's list), with the scores computed straight from the paged key pool in one launch
        (dsv4.kernels.indexer_scores); page/off/present [B, N] name each row's entry slots."""
        from dsv4.kernels.indexer_scores import indexer_pick, indexer_scores
        if TOPK_IN_SCORES and self.use_kernels:
            picked, valid = indexer_pick(q, weights, pool, page, off, present, min(self.topk, page.shape[1]),
                                         MARK_ABSENT)
        else:
            picked, valid = self._pick(indexer_scores(q, weights, pool, page, off, present), present, MARK_ABSENT)
        return picked if MARK_ABSENT else torch.where(valid, picked, -1)

    def _pick(self, scores: torch.Tensor, present: torch.Tensor,
              mark_absent: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        k = min(self.topk, scores.shape[1])
        if self.use_kernels and scores.is_cuda:  # the same selection in one launch (radix select; the -1s too)
            from dsv4.kernels.topk import topk_lowest_index
            return topk_lowest_index(scores, k, present, mark_absent)
        picked = top_k_lowest_index(scores, k).sort(dim=1).values
        valid = present.gather(1, picked)
        return (torch.where(valid, picked, -1) if mark_absent else picked), valid

    def _scores_padded(self, q, weights, keys, present) -> torch.Tensor:
        acc = acc_dtype(q.dtype)
        scores = torch.relu(torch.einsum("bhd,bnd->bhn", q.to(acc), keys.to(acc)).to(q.dtype))
        scores = (scores.to(acc) * weights.to(acc).unsqueeze(-1)).sum(dim=1).to(q.dtype)
        return scores.masked_fill(~present, float("-inf"))

    def select_indices(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                       positions: torch.Tensor) -> torch.Tensor:
        """[T, min(index_topk, N)] long: the keys each query attends to, -1 where it sees fewer.
        Queries are scored in blocks of QUERY_BLOCK (the [T, heads, N] scores of a long prompt would
        not fit in memory)."""
        n_keys = keys.shape[0]
        if self.use_kernels and q.is_cuda and q.dtype == torch.bfloat16 and keys.dtype == torch.bfloat16 and n_keys:
            return self._select_kernel(q, weights, keys, positions)
        acc = acc_dtype(q.dtype)  # the reference computes these in bf16; the model dtype rounds here
        tensor_cores = bf16_gemm_applies(q, keys)  # CUDA bf16: exact products into fp32
        keys_acc = keys if tensor_cores else keys.to(acc)
        entry = torch.arange(n_keys, device=keys.device)
        out = torch.empty(q.shape[0], min(self.topk, n_keys), dtype=torch.long, device=keys.device)
        for b0 in range(0, q.shape[0], QUERY_BLOCK):
            qb, wb = q[b0:b0 + QUERY_BLOCK], weights[b0:b0 + QUERY_BLOCK]
            visible = (positions[b0:b0 + QUERY_BLOCK] + 1) // self.ratio
            scores = bf16_gemm_fp32(qb, keys) if tensor_cores else torch.einsum("thd,nd->thn", qb.to(acc), keys_acc)
            scores = torch.relu(scores.to(q.dtype))
            scores = (scores.to(acc) * wb.to(acc).unsqueeze(-1)).sum(dim=1).to(q.dtype)
            scores = scores.masked_fill(entry[None, :] >= visible[:, None], float("-inf"))
            picked = top_k_lowest_index(scores, out.shape[1])
            out[b0:b0 + QUERY_BLOCK] = torch.where(picked < visible[:, None], picked, -1)
        return out

    def _select_kernel(self, q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
                       positions: torch.Tensor) -> torch.Tensor:
        """`select_indices` in two launches per block of queries: the scores of the block against every
        key (dsv4.kernels.indexer_scores; fp32 sums in another order, so rare 1-ulp bf16 flips) and the
        radix top-k (the same set as the sort; the list ascending instead of by score; int32)."""
        from dsv4.kernels.indexer_scores import prefill_index_scores
        from dsv4.kernels.topk import topk_lowest_index

        n_keys = keys.shape[0]
        keys = keys.contiguous()
        k = min(self.topk, n_keys)
        block = max(QUERY_BLOCK, KERNEL_SCORES // n_keys)  # bounds the [block, N] bf16 scores
        visible = visible_entries(positions, self.ratio)
        out = None if q.shape[0] <= block else torch.empty(q.shape[0], k, dtype=torch.int32, device=keys.device)
        for b0 in range(0, q.shape[0], block):
            seen = visible[b0:b0 + block]
            scores = prefill_index_scores(q[b0:b0 + block], weights[b0:b0 + block], keys, seen,
                                          fp4=self.numerics.simulate_indexer_fp4)  # (PREFILL_FP8: the same scores)
            # picks past the visible count as -1, int32 as the prefill attention kernel reads them: one launch
            picked, _ = topk_lowest_index(scores, k, mark_absent=True, visible=seen, index_dtype=torch.int32)
            if out is None:  # one block (short chunks): no copy into a list of all
                return picked
            out[b0:b0 + block] = picked
        return out
