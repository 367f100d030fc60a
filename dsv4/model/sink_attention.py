"""The attention softmax of spec §2.5 in torch: one softmax over the window keys a query sees and its
compressed entries, with a per-head sink logit in the denominator only (K = V). `sink_attention` is the
model's path for prefill and per-sequence decode and the reference the attention kernels are tested against;
`sink_attention_decode` is the same arithmetic for one query per sequence over padded keys."""
from __future__ import annotations

import torch

from dsv4.model.linear import bf16_gemm_applies, bf16_gemm_fp32
from dsv4.model.numerics import acc_dtype

QUERY_BLOCK = 256  # queries scored together; bounds the score tensor to ~QUERY_BLOCK x (window + block)


def sink_attention(q: torch.Tensor, q_pos: torch.Tensor, keys: torch.Tensor, key_pos: torch.Tensor,
                   window: int, entries: torch.Tensor | None, entry_mask: torch.Tensor | None,
                   sink: torch.Tensor, scale: float, first: tuple[int, int] | None = None,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """One softmax over (window keys visible to each query) U (masked compressed entries), plus sink.

    q [n, H, Dh], q_pos [n]; keys [K, Dh] with ascending positions key_pos [K] (K = V);
    entries [N, Dh] with entry_mask [n, N]; sink [H] (fp32). Returns [n, H, Dh] in q.dtype (written
    into `out` when given). `first = (q_pos[0], key_pos[0])` says that both position lists are
    consecutive (the model's case), so the key range of a query block is found without reading
    positions back from the device.
    """
    acc = acc_dtype(q.dtype)
    out = torch.empty_like(q) if out is None else out
    for b0 in range(0, q.shape[0], QUERY_BLOCK):
        qb, pb = q[b0:b0 + QUERY_BLOCK], q_pos[b0:b0 + QUERY_BLOCK]
        if first is not None:
            p0 = first[0] + b0
            lo = max(0, p0 - window + 1 - first[1])
            hi = min(keys.shape[0], p0 + qb.shape[0] - first[1])
        else:
            lo = int(torch.searchsorted(key_pos, pb[0] - window + 1))
            hi = int(torch.searchsorted(key_pos, pb[-1], right=True))
        kb, kpos = keys[lo:hi], key_pos[lo:hi]
        visible = (kpos[None, :] <= pb[:, None]) & (kpos[None, :] > pb[:, None] - window)
        values = kb
        if entries is not None and entries.shape[0]:
            values = torch.cat((kb, entries))
            visible = torch.cat((visible, entry_mask[b0:b0 + QUERY_BLOCK]), dim=1)
        tensor_cores = bf16_gemm_applies(qb, values)  # CUDA bf16: exact products into fp32
        if not tensor_cores:
            values = values.to(acc)
        scores = bf16_gemm_fp32(qb, values) if tensor_cores else torch.einsum("thd,kd->thk", qb.to(acc), values)
        scores = scores * scale
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        peak = scores.amax(dim=-1, keepdim=True)  # finite: a query always sees its own kv
        probs = torch.exp(scores - peak)
        denom = probs.sum(dim=-1) + torch.exp(sink.to(acc)[None, :] - peak.squeeze(-1))
        probs = probs.to(q.dtype)  # the reference feeds bf16 probabilities to P.V
        ob = bf16_gemm_fp32(probs, values.t()) if tensor_cores else torch.einsum("thk,kd->thd", probs.to(acc), values)
        ob = ob / denom.unsqueeze(-1)
        out[b0:b0 + QUERY_BLOCK] = ob.to(q.dtype)
    return out


def lengths_mask(lengths: list[int], width: int, device, left: bool = False) -> torch.Tensor:
    """[B, width] bool: the first (or, left-padded, the last) lengths[b] slots of row b."""
    n = torch.tensor(lengths, device=device)[:, None]
    slot = torch.arange(width, device=device)[None, :]
    return slot >= width - n if left else slot < n


def sink_attention_decode(q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, sink: torch.Tensor,
                           scale: float, out: torch.Tensor) -> None:
    """`sink_attention` for one query per sequence over padded keys: q [B, H, Dh], keys [B, K, Dh],
    visible [B, K] -> out [B, H, Dh] (same arithmetic, masked slots get zero weight)."""
    acc = acc_dtype(q.dtype)
    values = keys.to(acc)
    scores = torch.einsum("bhd,bkd->bhk", q.to(acc), values) * scale
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)  # finite: the token's own kv is always visible
    probs = torch.exp(scores - peak)
    denom = probs.sum(dim=-1) + torch.exp(sink.to(acc)[None, :] - peak.squeeze(-1))
    probs = probs.to(q.dtype).to(acc)
    out.copy_((torch.einsum("bhk,bkd->bhd", probs, values) / denom.unsqueeze(-1)).to(q.dtype))
