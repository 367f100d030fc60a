"""Which slice of every weight a rank holds, and how to cut it from a (possibly quantised) tensor.

Layout over the TP group (size tp, index tp_rank) and the EP group (size ep, index ep_rank):

  split by TP                                             replicated
  attn.wq_b     rows, heads [h0, h0 + H/tp) x Dh           attn.wq_a, q_norm, wkv, kv_norm: the q latent
  attn.attn_sink heads                                      and the one shared K=V head feed every head
  attn.wo_a     rows, groups [g0, g0 + G/tp) x Ro           compressor, indexer: they produce the KV
  attn.wo_b     columns, the same groups (row-parallel,      entries / selection every head uses; split,
                partial sums all-reduced)                    they would need an all-reduce of [T, N] scores
  shared_experts w1/w3 rows, w2 columns (I/tp each)          gate (router), norms, mHC, MTP e/h_proj
  embed, head   vocabulary rows [v0, v0 + V/tp)
  split by EP: routed experts [ep_rank E/ep, (ep_rank+1) E/ep), whole (never cut: each expert's output
  is rounded to the model dtype on its own, exactly like one process does).

Cuts must keep the reference's quantisation blocks whole: FP8 weight tiles are 128x128, and the FP8
activation quantisation of a linear's input runs per 128 channels, so the input slice of wo_b and
shared w2 must start on a multiple of 128. Heads and groups that do not divide by tp are an error;
a shared expert whose I/tp is not a multiple of 128 stays replicated (tiny test models).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch

from dsv4.config import ModelConfig
from dsv4.distributed.parallel_state import ParallelState

log = logging.getLogger(__name__)

BLOCK = 128  # FP8 weight tile and activation-quantisation block
_BLOCK_PREFIX = r"^(?:layers\.\d+|mtp\.0)\."
_EXPERT = re.compile(_BLOCK_PREFIX + r"ffn\.experts\.(\d+)\.w[123]\.(?:weight|scale)$")


@dataclass(frozen=True)
class Cut:
    """Keep [start, start + length) along `dim` of the logical (unquantised) weight."""
    dim: int
    start: int
    length: int


class Layout:
    """The shards of rank `rank` for a config and (tp, ep): pure arithmetic (the planner uses it
    without processes). A model's layout also carries its `ParallelState` (`ps`) for collectives."""

    def __init__(self, config: ModelConfig, tp: int, ep: int, rank: int, ps: "ParallelState | None" = None):
        c = config
        self.config, self.tp, self.ep, self.rank, self.ps = c, tp, ep, rank, ps
        self.tp_rank, self.ep_rank = rank % tp, rank % ep
        if c.num_heads % tp or c.o_groups % tp:
            raise ValueError(f"--tp {tp} must divide num_attention_heads={c.num_heads} and o_groups={c.o_groups}")
        if c.vocab_size % tp:
            raise ValueError(f"--tp {tp} must divide vocab_size={c.vocab_size}")
        if c.n_routed_experts % ep:
            raise ValueError(f"--ep {ep} must divide n_routed_experts={c.n_routed_experts}")
        self.heads, self.groups = c.num_heads // tp, c.o_groups // tp
        self.head_start, self.group_start = self.tp_rank * self.heads, self.tp_rank * self.groups
        if tp > 1 and (self.groups * c.o_lora_rank) % BLOCK:
            raise ValueError(f"--tp {tp}: o_groups/tp * o_lora_rank = {self.groups * c.o_lora_rank} is not a "
                             f"multiple of {BLOCK} (wo_b's FP8 input blocks would be cut)")
        self.vocab = c.vocab_size // tp
        self.vocab_start = self.tp_rank * self.vocab
        inter = c.moe_intermediate_size
        self.shared_split = tp > 1 and (inter // tp) % BLOCK == 0 and inter % tp == 0
        if tp > 1 and not self.shared_split:
            log.info("shared expert stays replicated: moe_intermediate_size/tp = %s is not a multiple of %d",
                     inter / tp, BLOCK)
        self.shared_inter = inter // tp if self.shared_split else inter
        self.shared_start = self.tp_rank * self.shared_inter if self.shared_split else 0
        per = c.n_routed_experts // ep
        self.experts = range(self.ep_rank * per, (self.ep_rank + 1) * per)

    @classmethod
    def of(cls, config: ModelConfig, ps: "ParallelState") -> "Layout":
        return cls(config, ps.tp, ps.ep, ps.rank, ps)

    def expert_owner(self, expert: torch.Tensor) -> torch.Tensor:
        """EP rank holding each expert id."""
        return torch.div(expert, len(self.experts), rounding_mode="floor")

    # ---- names -> slices -----------------------------------------------------------------------
    def owns(self, name: str) -> bool:
        """False only for the routed experts of other EP ranks."""
        m = _EXPERT.match(name)
        return m is None or int(m.group(1)) in self.experts

    def cut(self, name: str) -> Cut | None:
        """The slice of weight `name` (an official parameter name, `.weight`/tensor, not `.scale`)
        this rank keeps; None = the whole tensor."""
        c = self.config
        if self.tp == 1:
            return None
        if name in ("embed.weight", "head.weight"):
            return Cut(0, self.vocab_start, self.vocab)
        m = re.match(_BLOCK_PREFIX + r"(.*)$", name)
        if m is None:
            return None
        local = m.group(1)
        ro, dh = c.o_lora_rank, c.head_dim
        if local == "attn.attn_sink":
            return Cut(0, self.head_start, self.heads)
        if local == "attn.wq_b.weight":
            return Cut(0, self.head_start * dh, self.heads * dh)
        if local == "attn.wo_a.weight":
            return Cut(0, self.group_start * ro, self.groups * ro)
        if local == "attn.wo_b.weight":
            return Cut(1, self.group_start * ro, self.groups * ro)
        if self.shared_split and local in ("ffn.shared_experts.w1.weight", "ffn.shared_experts.w3.weight"):
            return Cut(0, self.shared_start, self.shared_inter)
        if self.shared_split and local == "ffn.shared_experts.w2.weight":
            return Cut(1, self.shared_start, self.shared_inter)
        return None

    def local_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Logical shape after the cut (for a weight or other parameter)."""
        cut = self.cut(name)
        if cut is None:
            return tuple(shape)
        out = list(shape)
        out[cut.dim] = cut.length
        return tuple(out)


# ---- cutting tensors -----------------------------------------------------------------------------

def take(name: str, tensor: torch.Tensor, cut: Cut | None) -> torch.Tensor:
    """Cut an unquantised tensor (a view; the caller copies it into the parameter)."""
    if cut is None:
        return tensor
    if cut.start + cut.length > tensor.shape[cut.dim]:
        raise ValueError(f"{name}: shape {tuple(tensor.shape)} too small for slice {cut}")
    return tensor.narrow(cut.dim, cut.start, cut.length)


def take_fp8_pair(name: str, weight: torch.Tensor, scale: torch.Tensor, cut: Cut | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut an FP8 block-quantised weight [N, K] and its [ceil(N/128), ceil(K/128)] scale alike.

    The slice must start on a tile boundary and end on one (or at the end of the dim)."""
    if cut is None:
        return weight, scale
    if weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name}: only FP8 block weights can be cut across ranks, got {weight.dtype} "
                         "(routed experts are split by expert, never inside one)")
    end, size = cut.start + cut.length, weight.shape[cut.dim]
    if cut.start % BLOCK or (end % BLOCK and end != size) or end > size:
        raise ValueError(f"{name}: slice [{cut.start}, {end}) of dim {cut.dim} (size {size}) does not "
                         f"follow the {BLOCK}-wide FP8 scale tiles")
    first, last = cut.start // BLOCK, -(-end // BLOCK)
    return weight.narrow(cut.dim, cut.start, cut.length), scale.narrow(cut.dim, first, last - first)
