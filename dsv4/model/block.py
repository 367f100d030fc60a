"""One transformer block (spec §2.2): mHC around attention, then mHC around the MoE."""
from __future__ import annotations

import torch
from torch import nn

from dsv4.config import LayerSpec, ModelConfig
from dsv4.model.attention import Attention
from dsv4.model.context import Segment
from dsv4.model.hyper import hc_post, hc_pre
from dsv4.model.moe import MoE
from dsv4.model.norm import RMSNorm
from dsv4.model.numerics import Numerics, acc_dtype


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

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor | None, positions: torch.Tensor,
                segments: list[Segment]) -> torch.Tensor:
        """x: residual streams [T, hc, D] -> [T, hc, D]."""
        u, post, comb = hc_pre(x, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, **self.hc_kwargs)
        x = hc_post(self.attn(self.attn_norm(u), positions, segments), x, post, comb)
        u, post, comb = hc_pre(x, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, **self.hc_kwargs)
        return hc_post(self.ffn(self.ffn_norm(u), token_ids), x, post, comb)
