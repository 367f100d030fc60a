"""Routed experts across EP ranks: the two ways of getting tokens to experts and results back.

Every rank holds all T tokens (hidden states are replicated) and routes them identically. What one
process computes (spec §2.9, docs/numerics.md) is

    y = round( sum_{e picked, ascending e} round(y_e)  +  round(y_shared) )    (sum in acc dtype)

`allreduce`: each rank runs its own experts on the tokens routed to them and adds the rounded
outputs in acc dtype; one all-reduce over the EP group sums the ranks' partials (the shared expert's
TP partial rides in the same all-reduce when TP and EP groups coincide). One collective per layer,
volume T x D in acc dtype: the latency-bound decode case's friend.

`alltoall`: the EP ranks split the tokens in contiguous shards; a rank sends each (token, slot) of its
shard to the rank owning that expert (dispatch: counts, then rows + (expert, weight)), the owner
computes and returns the rounded rows (combine), the home rank adds them in ascending expert order,
exactly as one process does (bit-identical sums), and an all-gather re-replicates the T x D output.
Four collectives per layer; sends each token's row once per remote slot.

Both keep the expert outputs' rounding points, so either matches one process (allreduce up to the
summation order of the partials, i.e. the last bit of the acc dtype before the final rounding).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from dsv4.model.numerics import acc_dtype, quantize_activation


def moe_forward(moe, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The parallel MoE output [T, D] (model dtype) for router output (weights, ids) [T, k].

    Kernel mode (`moe.packed`, GPU) always combines by all-reduce: the fused kernel computes the
    rank's experts for all tokens in one launch and quantises its input itself."""
    if moe.packed is not None:
        return _allreduce(moe, x, x, weights, ids)
    xq = quantize_activation(x) if moe.quantize_input else x
    if moe.layout.ps.moe_comm == "alltoall" and moe.layout.ep > 1:
        return _alltoall(moe, x, xq, weights, ids)
    return _allreduce(moe, x, xq, weights, ids)


def rank_moe_config(num_pairs: int, owned: int, num_experts: int, hidden: int = 0):
    """The routed kernels' launch shape for a rank holding `owned` of `num_experts` experts: `pick_moe_config` of
    the pairs it can expect to compute (a uniform router's share; the other ranks' pairs, marked -1, are skipped),
    i.e. what one GPU picks at the same pairs per expert. Counting all T x k pairs over the rank's experts would
    take the kernels measured for ep times as many pairs per expert. Estimated, not counted: a count would sync."""
    from dsv4.kernels.moe_config import pick_moe_config

    return pick_moe_config(max(1, round(num_pairs * owned / num_experts)), owned, hidden=hidden)


def _local_experts(moe, xq: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, acc: torch.dtype
                   ) -> torch.Tensor:
    """Sum over this rank's experts of round(y_e), ascending expert id, in acc dtype."""
    if moe.packed is not None:  # fused kernel: other ranks' pairs marked -1, fp32 partial sum
        from dsv4.kernels.moe import fused_moe
        owned = moe.layout.experts
        local = ids - owned.start
        local = torch.where((local >= 0) & (local < len(owned)), local, -1).to(torch.int32)
        return fused_moe(xq, local, weights, moe.packed, moe.limit, act="fp8", out_dtype=acc,
                         config=rank_moe_config(ids.numel(), len(owned), moe.gate.n_experts, moe.packed.hidden))
    y = torch.zeros(xq.shape, dtype=acc, device=xq.device)
    owned = moe.layout.experts
    for e in torch.unique(ids).tolist():
        if e in owned:
            tokens, slot = torch.where(ids == e)
            y.index_add_(0, tokens, moe.experts[e](xq[tokens], weights[tokens, slot], input_ready=True).to(acc))
    return y


def _shared_partial(moe, xq: torch.Tensor, acc: torch.dtype) -> torch.Tensor | None:
    """This rank's part of the shared expert before its rounding (acc dtype); the whole output,
    already rounded, when the shared expert is replicated."""
    if moe.shared_experts is None:
        return None
    if moe.layout.shared_split:
        return moe.shared_experts(xq, input_ready=True, out_dtype=acc)
    return moe.shared_experts(xq, input_ready=True).to(acc)


def _finish_shared(moe, partial: torch.Tensor | None, dtype: torch.dtype, reduced: bool = False
                   ) -> torch.Tensor | None:
    """round(y_shared) in acc dtype from this rank's partial (all-reduced over TP unless `reduced`)."""
    if partial is None or not moe.layout.shared_split:
        return partial
    if not reduced:
        moe.layout.ps.reduce_tp(partial)
    return partial.to(dtype).to(partial.dtype)


def _allreduce(moe, x, xq, weights, ids) -> torch.Tensor:
    acc, ps = acc_dtype(x.dtype), moe.layout.ps
    routed = _local_experts(moe, xq, weights, ids, acc)
    shared = _shared_partial(moe, xq, acc)
    if shared is not None and moe.layout.shared_split and ps.same_groups and ps.ep > 1:
        both = ps.reduce_ep(torch.stack((routed, shared)))  # one collective for both sums
        routed, shared = both[0], _finish_shared(moe, both[1], x.dtype, reduced=True)
    else:
        ps.reduce_ep(routed)
        shared = _finish_shared(moe, shared, x.dtype)
    if shared is not None:
        routed += shared
    return routed.to(x.dtype)


def _all_to_all(rows: torch.Tensor, send_counts: list[int], recv_counts: list[int], group) -> torch.Tensor:
    out = rows.new_empty((sum(recv_counts),) + tuple(rows.shape[1:]))
    dist.all_to_all_single(out, rows.contiguous(), recv_counts, send_counts, group=group)
    return out


def _alltoall(moe, x, xq, weights, ids) -> torch.Tensor:
    acc, ps, layout = acc_dtype(x.dtype), moe.layout.ps, moe.layout
    t, k = ids.shape
    chunk = -(-t // ps.ep)
    t0, t1 = min(ps.ep_rank * chunk, t), min((ps.ep_rank + 1) * chunk, t)
    my_ids, my_w = ids[t0:t1], weights[t0:t1]

    # dispatch: (token, slot) pairs of this shard, grouped by the EP rank owning the expert
    flat_ids = my_ids.reshape(-1)
    dest = layout.expert_owner(flat_ids)
    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=ps.ep)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=ps.ep_group)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    rows = xq[t0:t1].repeat_interleave(k, dim=0)[order]
    meta = torch.stack((flat_ids[order].to(acc), my_w.reshape(-1)[order].to(acc)), dim=1)
    got_rows = _all_to_all(rows, send, recv, ps.ep_group)
    got_meta = _all_to_all(meta, send, recv, ps.ep_group)

    # the owned experts, each on its rows; outputs rounded to the model dtype as in one process
    got_ids, got_w = got_meta[:, 0].long(), got_meta[:, 1]
    out = torch.empty(got_rows.shape, dtype=x.dtype, device=x.device)
    for e in torch.unique(got_ids).tolist():
        sel = torch.where(got_ids == e)[0]
        out[sel] = moe.experts[e](got_rows[sel], got_w[sel], input_ready=True)

    # combine: rows come back in send order; sum each token's slots in ascending expert id
    back = _all_to_all(out, recv, send, ps.ep_group)
    per_slot = torch.empty_like(back)
    per_slot[order] = back
    per_slot = per_slot.view(t1 - t0, k, x.shape[1])
    slot_order = torch.argsort(my_ids, dim=1, stable=True)
    per_slot = torch.gather(per_slot, 1, slot_order[..., None].expand_as(per_slot))
    y = torch.zeros(t1 - t0, x.shape[1], dtype=acc, device=x.device)
    for j in range(k):
        y += per_slot[:, j].to(acc)
    shared = _finish_shared(moe, _shared_partial(moe, xq, acc), x.dtype)
    if shared is not None:
        y += shared[t0:t1]
    y = y.to(x.dtype)

    # re-replicate: equal-sized pieces for all_gather, trimmed back to T rows
    padded = torch.zeros(chunk, x.shape[1], dtype=x.dtype, device=x.device)
    padded[: t1 - t0] = y
    return layout.ps.gather_ep(padded, dim=0)[:t]
