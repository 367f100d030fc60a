"""One transformer block (spec §2.2): mHC around attention, then mHC around the MoE.

Kernel mode (`use_mhc_kernels`, bf16 on CUDA): the mHC sites run through dsv4.kernels.mhc — pre with
the sub-layer's RMSNorm fused, the attention's post fused with the MoE's pre — five launches per
block instead of ~250 small torch ops (Sinkhorn's 20 iterations dominate those); four with
FUSE_BLOCK_SITES (`run_blocks`: the MoE's post fused with the next block's attention pre)."""
from __future__ import annotations

import torch
from torch import nn

from dsv4.config import LayerSpec, ModelConfig
from dsv4.model.attention import Attention, AttentionInputs
from dsv4.model.context import Segment
from dsv4.model.hyper import hc_post, hc_pre
from dsv4.model.moe import MoE
from dsv4.model.norm import RMSNorm
from dsv4.model.numerics import Numerics, acc_dtype

# Kernel mode: each block's MoE post is left to the next block's attention pre, one `hc_post_pre` site instead
# of `hc_post` + `hc_pre` (one pass over the residual streams and one launch fewer per block; the last block's
# post runs after the loop). X' keeps its bits; the attention site's mixes are summed in another fp32 order.
# Session 37 (8 Flash layers, one H200): 7 launches fewer per eager decode step, graph replay unchanged (1.25-1.27
# ms at B = 1), 8K prefill 96-97 vs 98 ms. False: one site per sub-layer (the A/B and the tests' reference).
FUSE_BLOCK_SITES = True
# Kernel mode, decode sizes (up to COMBINE_MAX_T tokens) with FUSE_BLOCK_SITES: each block's routed-MoE combine
# (top-k rows + shared expert, fp32 sum rounded to bf16) summed by the next block's attention-site mix as it loads
# the MoE output (`moe_combine.PendingCombine`, `mhc_kernels`' mixes): the combine's launch and its output's round
# trip go (one launch per layer). Same bits (tests/gpu/test_site_fusions.py). s51, 8 Flash layers ctx 4096: B = 1
# graph replay 1.07 / 1.07 / 1.07 vs 1.08 x 4 off (alternating), B = 2 1.48-1.60 either way
COMBINE_IN_NEXT_SITE = True
COMBINE_MAX_T = 16  # (prefill's mix tiles are left as they are)
# Kernel mode, paged decode step: the tables the later blocks' attention derives on first use (cos / sin per RoPE kind
# and position set, entry and key slots: `Attention.step_tables`) derived at the step's start on a side stream
# (`side_stream`, "step_tables") beside the first block, joined before the second; the first block's own on the main
# stream first, so it never reads one the branch is still writing. s52's timeline: ≈ 25 µs of small launches per step
# on the main stream in the first CSA and HCA layers. On since s54 (with attention.INDEXER_BESIDE, which see)
STEP_TABLES_BESIDE = True


class Block(nn.Module):
    def __init__(self, config: ModelConfig, spec: LayerSpec, dtype: torch.dtype, numerics: Numerics,
                 layout=None):
        super().__init__()
        self.spec = spec
        hc, mix, acc = config.hc_mult, config.hc_mix_dim, acc_dtype(dtype)
        self.hc_kwargs = dict(sinkhorn_iters=config.hc_sinkhorn_iters, hc_eps=config.hc_eps,
                              norm_eps=config.rms_norm_eps)
        for site in ("attn", "ffn"):
            self.register_parameter(f"hc_{site}_fn", nn.Parameter(
                torch.empty(mix, hc * config.hidden_size, dtype=acc), requires_grad=False))
            self.register_parameter(f"hc_{site}_base", nn.Parameter(torch.empty(mix, dtype=acc), requires_grad=False))
            self.register_parameter(f"hc_{site}_scale", nn.Parameter(torch.empty(3, dtype=acc), requires_grad=False))
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.attn = Attention(config, spec, dtype, numerics, layout)
        self.ffn = MoE(config, spec, dtype, numerics, layout)
        self.mhc = None  # kernel mode: {site: dsv4.kernels.mhc.MixWeight}

    def use_mhc_kernels(self) -> None:
        """Run mHC through the Triton kernels (after the weights are final; call again after a reload)."""
        from dsv4.kernels.mhc import prepare_mix
        self.mhc = {site: prepare_mix(getattr(self, f"hc_{site}_fn")) for site in ("attn", "ffn")}

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor | None, positions: torch.Tensor,
                segments: list[Segment] | None, step=None, carry: tuple | None = None, defer: bool = False,
                head_step=None):
        """x: residual streams [T, hc, D] -> [T, hc, D] (`step`, `head_step`: a paged decode step for all rows, for
        the first rows of a mixed step; see Attention.attend).
        Kernel mode only: `carry` = the previous block's deferred MoE post (f, post, comb), applied to x by this
        block's attention pre; `defer`: -> (x, carry) with this block's MoE post deferred (`run_blocks`)."""
        if carry is not None:
            x, hc, pre = self._pre_after(x, carry, positions, step)
        else:
            hc, pre = self.pre(x, positions, step)
        rotated = self.attn.rotates(pre, segments, step)
        attended = self.attn.attend(pre, positions, segments, step=step, rotate=rotated, head_step=head_step)
        return self.post(x, attended, pre, hc, token_ids, rotated=rotated, defer=defer)

    # pre and post touch no sequence state: decode under CUDA graphs (dsv4.model.graphs) captures
    # them and runs `attn.attend` eagerly in between.

    def pre(self, x: torch.Tensor, positions: torch.Tensor, step=None) -> tuple[tuple, AttentionInputs]:
        """mHC pre of the attention site + attention `prepare` -> ((post, comb), attention inputs) (`step`: the
        paged decode step, for `prepare`)."""
        if self.mhc is not None:
            from dsv4.kernels import mhc
            u, post, comb = mhc.hc_pre(x, self.mhc["attn"], self.hc_attn_base, self.hc_attn_scale,
                                       norm_weight=self.attn_norm.weight, **self.hc_kwargs)
        else:
            u, post, comb = hc_pre(x, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, **self.hc_kwargs)
            u = self.attn_norm(u)
        return (post, comb), self.attn.prepare(u, positions, step)

    def _pre_after(self, x: torch.Tensor, carry: tuple, positions: torch.Tensor, step=None):
        """The previous block's deferred MoE post fused into this block's attention pre -> (X', (post, comb),
        attention inputs)."""
        from dsv4.kernels import mhc
        f, post, comb = carry
        x, u, post, comb = mhc.hc_post_pre(f, x, post, comb, self.mhc["attn"], self.hc_attn_base,
                                           self.hc_attn_scale, norm_weight=self.attn_norm.weight, **self.hc_kwargs)
        return x, (post, comb), self.attn.prepare(u, positions, step)

    def defers_combine(self, tokens: int) -> bool:
        """Whether a deferred MoE post leaves the routed combine to the next site too (COMBINE_IN_NEXT_SITE; world 1
        only: a sharded MoE all-reduces its partial sums first, `dsv4.distributed.moe_comm`)."""
        return COMBINE_IN_NEXT_SITE and tokens <= COMBINE_MAX_T and self.ffn.layout is None

    def post(self, x: torch.Tensor, attended: torch.Tensor, pre: AttentionInputs, hc: tuple,
             token_ids: torch.Tensor | None, rotated: bool = False, defer: bool = False):
        """Attention `finish` (`rotated`: the attention applied the inverse RoPE), mHC post, the MoE site
        -> the block's output streams (defer, kernel mode: -> (the streams before the MoE post, (MoE output,
        post, comb)))."""
        f = self.attn.finish(attended, pre, rotated)
        post, comb = hc
        if self.mhc is not None:
            from dsv4.kernels import mhc
            from dsv4.kernels.moe_combine import deferred
            x, u, post, comb = mhc.hc_post_pre(f, x, post, comb, self.mhc["ffn"], self.hc_ffn_base,
                                               self.hc_ffn_scale, norm_weight=self.ffn_norm.weight, **self.hc_kwargs)
            with deferred(defer and self.defers_combine(u.shape[0])):
                y = self.ffn(u, token_ids)  # (deferred: a PendingCombine, summed by the next site or `finish_carry`)
            return (x, (y, post, comb)) if defer else mhc.hc_post(y, x, post, comb)
        x = hc_post(f, x, post, comb)
        u, post, comb = hc_pre(x, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, **self.hc_kwargs)
        return hc_post(self.ffn(self.ffn_norm(u), token_ids), x, post, comb)


def fuses_block_sites(blocks) -> bool:
    """Whether `run_blocks` leaves each block's MoE post to the next block's attention pre (FUSE_BLOCK_SITES, kernel
    mode); every path that claims the eager forward's bits (dsv4.model.graphs' pieces) must do the same."""
    return FUSE_BLOCK_SITES and all(b.mhc is not None for b in blocks)


def run_blocks(blocks, x: torch.Tensor, token_ids: torch.Tensor | None, positions: torch.Tensor,
               segments_of, step=None, head_step=None) -> torch.Tensor:
    """The blocks in order on residual streams x [T, hc, D] (`segments_of(i)`: block i's segments; `step`,
    `head_step`: see Block.forward). With
    FUSE_BLOCK_SITES in kernel mode, each block's MoE post runs inside the next block's attention pre."""
    fuse = fuses_block_sites(blocks)
    carry = None
    beside = STEP_TABLES_BESIDE and step is not None and len(blocks) > 1  # (a fork is always joined: capture)
    tables = _start_step_tables(blocks, positions, step) if beside else None
    for i, block in enumerate(blocks):
        if i == 1 and tables is not None:
            tables()  # (the main stream waits for the later blocks' tables here)
        out = block(x, token_ids, positions, segments_of(i), step=step, carry=carry, defer=fuse, head_step=head_step)
        x, carry = out if fuse else (out, None)
    return finish_carry(x, carry)


def _start_step_tables(blocks, positions: torch.Tensor, step):
    """STEP_TABLES_BESIDE: the first block's step tables now, the later blocks' in a side branch; its join."""
    from dsv4.model.side_stream import start_beside
    blocks[0].attn.step_tables(positions, step)
    return start_beside(positions.device, "step_tables", positions.shape[0],
                        lambda: [block.attn.step_tables(positions, step) for block in blocks[1:]])


def finish_carry(x: torch.Tensor, carry) -> torch.Tensor:
    """The last block's deferred MoE post (`carry` from `defer=True`; None: nothing deferred) on the streams x."""
    if carry is None:
        return x
    from dsv4.kernels import mhc
    f, post, comb = carry
    return mhc.hc_post(f, x, post, comb)
