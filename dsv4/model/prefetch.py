"""Decode: start a sub-layer's large weights into L2 on the side stream while the main stream runs the
small latency-bound kernels before them (dsv4.kernels.l2_prefetch).

At batch 1 a layer's step is ~25 kernels; the mHC mixes, norms, cache stores, indexer and attention
leave DRAM mostly idle, and the GEMVs after them stream their weights at 45-60 % of the copy bandwidth.
Each site forks a prefetch of the weights the main stream reads next and joins it at the end of the same
sub-layer (inside one CUDA-graph piece): the prefetch launch ends once its instructions are issued, so
the join costs no waiting. A prefetch changes no value -- the same kernels read the same bytes.

Sites (the weights, and where they are started):
  attn_in   wq_a | wkv, the compressor / indexer projections, wq_b (| indexer wq_b): before the mHC pre
  attn_out  wo_a, wo_b: before the attention core (cache stores, compressor, indexer, attention)
  ffn       the router and the shared expert: before the mHC post | pre of the MoE site
"""
from __future__ import annotations

from typing import Callable

import torch

SITES: tuple[str, ...] = ()  # off until an A/B on the H200 shows a gain (bench/runs)
MAX_ROWS = 8  # decode batches up to this many tokens (larger ones fill the GPU without help)
MIN_BYTES = 1 << 20  # smaller weights are not worth a launch


def _noop() -> None:
    return None


def prefetch_beside(device: torch.device, site: str, rows: int, weights: Callable[[], list]) -> Callable[[], None]:
    """Fork the L2 prefetch of `weights()` (tensors; None entries skipped) for `site` onto the side
    stream; returns the join. A no-op unless `site` is in SITES, on CUDA, for at most MAX_ROWS rows."""
    if site not in SITES or device.type != "cuda" or rows > MAX_ROWS:
        return _noop
    from dsv4.kernels.l2_prefetch import prefetch_l2_tensors
    from dsv4.model.side_stream import start_beside
    tensors = [t for t in weights() if t is not None and t.numel() * t.element_size() >= MIN_BYTES]
    return start_beside(device, "prefetch", rows, prefetch_l2_tensors, tensors) if tensors else _noop


def attention_input_weights(attn) -> list:
    """What `Attention.prepare` streams: the stacked pairs where stacked, the fused bf16 projections."""
    out, pairs = [], attn.fp8_pairs()
    for name, lins in pairs.items():
        stack = attn._fp8_stacks.get(name)
        out += [stack.weight] if stack is not None else [lin.weight for lin in lins]
    if "q_latent" not in pairs:  # no indexer: wq_b alone
        out.append(attn.wq_b.weight)
    if attn._fused is not None:
        out.append(attn._fused[0])
    return out


def attention_output_weights(attn) -> list:
    return [attn.wo_a.weight, attn.wo_b.weight]


def ffn_weights(moe) -> list:
    shared = moe.shared_experts
    out = [moe.gate.weight]
    if shared is not None:
        out += [shared.w13_weight, shared.w2.weight] if shared.w13_weight is not None \
            else [shared.w1.weight, shared.w3.weight, shared.w2.weight]
    return out
