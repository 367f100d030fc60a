"""Typed DeepSeek-V4 model config (`ModelConfig`), read from `config.json` by dsv4.config_parse.

Every derived per-layer fact (attention kind, MoE kind, RoPE base and YaRN) lives here so that nothing
else re-derives it. Spec: deepseek_v4_model.md §1.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ATTENTION_KINDS = {0: "sliding", 4: "csa", 128: "hca"}
EXPERT_DTYPES = ("fp4", "fp8")


@dataclass(frozen=True)
class Yarn:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float


@dataclass(frozen=True)
class Rope:
    theta: float
    yarn: Yarn | None  # None = plain RoPE


@dataclass(frozen=True)
class LayerSpec:
    index: int            # backbone layer index; L for the MTP block
    compress_ratio: int   # 0, 4 or 128
    moe: str              # "hash" or "topk"
    rope: Rope
    is_mtp: bool = False

    @property
    def attention(self) -> str:
        return ATTENTION_KINDS[self.compress_ratio]

    @property
    def has_compressor(self) -> bool:
        return self.compress_ratio > 0

    @property
    def has_indexer(self) -> bool:
        return self.compress_ratio == 4


@dataclass(frozen=True)
class QuantConfig:
    quant_method: str
    weight_block_size: tuple[int, int] = (128, 128)
    scale_fmt: str | None = None
    activation_scheme: str = "dynamic"
    ignored_layers: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    rope_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window: int
    compress_ratios: tuple[int, ...]  # length num_layers + 1 (last entry: MTP block, always 0)
    num_hash_layers: int
    rope_theta: float
    compress_rope_theta: float
    yarn: Yarn | None
    max_position_embeddings: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    scoring_func: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    swiglu_limit: float
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    rms_norm_eps: float
    bos_token_id: int
    eos_token_id: int
    num_nextn_predict_layers: int
    tie_word_embeddings: bool
    expert_dtype: str
    quantization: QuantConfig | None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    # ---- derived -----------------------------------------------------------------------
    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def hc_mix_dim(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def main_rope(self) -> Rope:
        return Rope(self.rope_theta, None)

    @property
    def compress_rope(self) -> Rope:
        return Rope(self.compress_rope_theta, self.yarn)

    def layer(self, index: int) -> LayerSpec:
        """Layer `index` in [0, num_layers] (index num_layers is the MTP block)."""
        if not 0 <= index <= self.num_layers:
            raise IndexError(f"layer {index} out of range [0, {self.num_layers}]")
        ratio = self.compress_ratios[index]
        is_mtp = index == self.num_layers
        moe = "hash" if (index < self.num_hash_layers and not is_mtp) else "topk"
        rope = self.compress_rope if ratio else self.main_rope
        return LayerSpec(index, ratio, moe, rope, is_mtp)

    @property
    def layers(self) -> tuple[LayerSpec, ...]:
        return tuple(self.layer(i) for i in range(self.num_layers))

    @property
    def mtp_layer(self) -> LayerSpec:
        return self.layer(self.num_layers)

    @property
    def is_quantized(self) -> bool:
        return self.quantization is not None

    @property
    def linear_scale_dtype(self) -> str:
        """Stored dtype of FP8 block scales: E8M0 with fp4 experts, float32 with fp8 experts."""
        return "e8m0" if self.expert_dtype == "fp4" else "float32"

    def layer_kind_counts(self) -> dict[str, int]:
        counts = {"sliding": 0, "csa": 0, "hca": 0}
        for spec in self.layers:
            counts[spec.attention] += 1
        return counts

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no config.json") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        from dsv4.config_parse import parse_config  # (it builds this class)
        return parse_config(d)

    def to_dict(self) -> dict:
        """Official (legacy-key) config.json content."""
        out = {
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": 1,
            "head_dim": self.head_dim,
            "qk_rope_head_dim": self.rope_dim,
            "q_lora_rank": self.q_lora_rank,
            "o_groups": self.o_groups,
            "o_lora_rank": self.o_lora_rank,
            "sliding_window": self.window,
            "compress_ratios": list(self.compress_ratios),
            "num_hash_layers": self.num_hash_layers,
            "rope_theta": self.rope_theta,
            "compress_rope_theta": self.compress_rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "scoring_func": self.scoring_func,
            "topk_method": "noaux_tc",
            "norm_topk_prob": self.norm_topk_prob,
            "routed_scaling_factor": self.routed_scaling_factor,
            "swiglu_limit": self.swiglu_limit,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps,
            "rms_norm_eps": self.rms_norm_eps,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "torch_dtype": "bfloat16",
            "expert_dtype": self.expert_dtype,
        }
        if self.yarn is not None:
            out["rope_scaling"] = {
                "type": "yarn",
                "factor": self.yarn.factor,
                "original_max_position_embeddings": self.yarn.original_max_position_embeddings,
                "beta_fast": self.yarn.beta_fast,
                "beta_slow": self.yarn.beta_slow,
            }
        if self.quantization is not None:
            q = self.quantization
            qd: dict[str, Any] = {
                "activation_scheme": q.activation_scheme,
                "fmt": "e4m3",
                "quant_method": q.quant_method,
                "weight_block_size": list(q.weight_block_size),
            }
            if q.scale_fmt:
                qd["scale_fmt"] = q.scale_fmt
            if q.ignored_layers:
                qd["ignored_layers"] = list(q.ignored_layers)
            out["quantization_config"] = qd
        return out
