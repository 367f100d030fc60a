"""The `deepseek_v4_fp8` quantization scheme: which stored format every module of a checkpoint has.

Released DeepSeek-V4 checkpoints say `quant_method: "fp8"`, but the format is more than plain FP8
block quantization: routed experts are MXFP4 (`expert_dtype: "fp4"`, Flash/Pro) or FP8 blocks with
float32 scales (`"fp8"`, Flash-Base), and the block scales of every other linear follow the expert
dtype (E8M0 with fp4, float32 with fp8). Like vLLM we re-route such configs to a dedicated scheme.

A linear is quantized in the official format iff it has a `.scale` companion; the set of those
linears is fixed by the architecture (`FP8_LINEARS`), minus anything the config lists in
`ignored_layers` / `modules_to_not_convert`. Spec: checkpoint_format.md §3, §5, §6;
deepseek_v4_model.md §1.4.
"""
from __future__ import annotations

import logging
import re
from typing import Literal

from dsv4.config import ModelConfig
from dsv4.config_parse import resolve_expert_dtype

log = logging.getLogger(__name__)

SCHEME_NAME = "deepseek_v4_fp8"
_FP8_METHODS = ("fp8", SCHEME_NAME)

# Leaf module names (after the block prefix) of the linears stored as FP8 blocks + `.scale`.
# Everything else (compressor/indexer projections except indexer.wq_b, router, embed, head) is BF16.
FP8_LINEARS = (
    "attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_a", "attn.wo_b", "attn.indexer.wq_b",
    "ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3",
    "e_proj", "h_proj",
)
_BLOCK_PREFIX = re.compile(r"^(?:layers\.\d+|mtp\.\d+)\.")
_ROUTED_EXPERT = re.compile(r"^(?:layers\.\d+|mtp\.\d+)\.ffn\.experts(?:\.\d+(?:\.w[123])?)?$")

# Fused module leaf -> the checkpoint modules it is built from (an engine may fuse these).
FUSED_SHARDS: dict[str, tuple[str, ...]] = {
    "w13": ("w1", "w3"),
    "wq_a_wkv": ("wq_a", "wkv"),
    "wqkv_a": ("wq_a", "wkv"),
}

_logged: set[str] = set()

QuantMethod = Literal["fp8_block", "mxfp4", "unquantized"]


def override(quant_cfg: dict | None, user_choice: str | None, model_type: str | None) -> str | None:
    """Return "deepseek_v4_fp8" if this scheme should handle the checkpoint, else None.

    Applies when the config's quant_method is fp8 or deepseek_v4_fp8 and either the model is
    DeepSeek-V4 or the user explicitly asked for this scheme.
    """
    if not isinstance(quant_cfg, dict) or quant_cfg.get("quant_method") not in _FP8_METHODS:
        return None
    if model_type == "deepseek_v4" or user_choice == SCHEME_NAME:
        return SCHEME_NAME
    return None


def _strip_model_prefix(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


class DeepseekV4FP8Config:
    """Per-module quantization method of a DeepSeek-V4 checkpoint.

    `quantized=False` describes an unquantized (BF16) checkpoint: every method is "unquantized".
    """

    def __init__(self, expert_dtype: str = "fp4", ignored_layers: tuple[str, ...] | list[str] = (),
                 quantized: bool = True):
        if expert_dtype not in ("fp4", "fp8"):
            raise ValueError(f"expert_dtype={expert_dtype!r} is not supported; allowed: fp4, fp8")
        self.expert_dtype = expert_dtype
        self.ignored_layers = frozenset(_strip_model_prefix(n) for n in ignored_layers)
        self.quantized = quantized

    @classmethod
    def from_config(cls, cfg: ModelConfig | dict) -> "DeepseekV4FP8Config":
        """From a parsed ModelConfig or a raw config.json dict (expert_dtype from the *model's* config)."""
        if isinstance(cfg, dict):
            expert_dtype = resolve_expert_dtype(cfg)
            qc = cfg.get("quantization_config")
            ignored = list((qc or {}).get("ignored_layers") or []) + \
                list((qc or {}).get("modules_to_not_convert") or [])
            quantized = qc is not None
        else:
            expert_dtype = cfg.expert_dtype
            ignored = list(cfg.quantization.ignored_layers) if cfg.quantization else []
            quantized = cfg.is_quantized
        if quantized and expert_dtype not in _logged:  # once per process and value, not per layer
            _logged.add(expert_dtype)
            log.info("deepseek_v4_fp8: expert_dtype=%s (routed experts %s, linear block scales %s)",
                     expert_dtype, "MXFP4" if expert_dtype == "fp4" else "FP8 block",
                     "E8M0" if expert_dtype == "fp4" else "float32")
        return cls(expert_dtype, ignored, quantized)

    @property
    def name(self) -> str:
        return SCHEME_NAME

    @property
    def linear_scale_dtype(self) -> str:
        """Stored dtype of FP8 block scales: "e8m0" with fp4 experts, "float32" with fp8 experts."""
        return "e8m0" if self.expert_dtype == "fp4" else "float32"

    # ---- ignored modules ------------------------------------------------------------------
    def _ignored(self, name: str) -> bool:
        """Exact module name, or any dotted parent of it (e.g. "layers.3.ffn.experts")."""
        parts = name.split(".")
        return any(".".join(parts[:i]) in self.ignored_layers for i in range(1, len(parts) + 1))

    def is_ignored(self, module_name: str) -> bool:
        """True if the module (or, for a fused module, all of its shards) stays unquantized.

        A fused module with some but not all shards ignored raises ValueError.
        """
        name = _strip_model_prefix(module_name)
        prefix, _, leaf = name.rpartition(".")
        shards = FUSED_SHARDS.get(leaf)
        if not shards:
            return self._ignored(name)
        flags = [self._ignored(f"{prefix}.{s}" if prefix else s) for s in shards]
        if any(flags) and not all(flags):
            raise ValueError(
                f"{module_name}: some but not all shards of this fused module are in ignored_layers "
                f"({', '.join(s for s, f in zip(shards, flags) if f)} ignored, "
                f"{', '.join(s for s, f in zip(shards, flags) if not f)} not); "
                "all shards of a fused module must have the same precision")
        return all(flags)

    # ---- methods --------------------------------------------------------------------------
    def get_quant_method(self, module_name: str, kind: str = "linear") -> QuantMethod:
        """Storage method of a module: "fp8_block" | "mxfp4" | "unquantized".

        kind: "linear" (any dense linear, possibly fused) or "experts" (routed experts: the
        `ffn.experts` container, one expert, or one expert projection).
        """
        if kind not in ("linear", "experts"):
            raise ValueError(f"{module_name}: unknown module kind {kind!r}; allowed: linear, experts")
        name = _strip_model_prefix(module_name)
        if kind == "experts" and not _ROUTED_EXPERT.match(name):
            raise ValueError(f"{module_name}: not a routed-expert module name")
        if not self.quantized or self.is_ignored(name):
            return "unquantized"
        if kind == "experts":
            return "mxfp4" if self.expert_dtype == "fp4" else "fp8_block"
        leaf = _BLOCK_PREFIX.sub("", name)
        prefix, _, last = leaf.rpartition(".")
        shards = FUSED_SHARDS.get(last)
        leaves = [f"{prefix}.{s}" if prefix else s for s in shards] if shards else [leaf]
        quantized = [lf in FP8_LINEARS for lf in leaves]
        if any(quantized) and not all(quantized):
            raise ValueError(f"{module_name}: fuses FP8 and BF16 linears; cannot share one method")
        return "fp8_block" if all(quantized) and _BLOCK_PREFIX.match(name) else "unquantized"

    def checkpoint_name_mapping(self) -> dict[str, tuple[str, int | None]]:
        """Routed-expert checkpoint suffix -> (fused engine parameter, shard id) for this expert dtype.

        `w1`/`w3` (gate/up) fill shards 0/1 of a fused `w13` parameter, `w2` the `w2` parameter.
        Scale parameters are named like vLLM's methods expect them: `weight_scale` for MXFP4
        (a multiplier per 32 inputs), `weight_scale_inv` for FP8 blocks.
        """
        scale = "weight_scale" if self.expert_dtype == "fp4" else "weight_scale_inv"
        return {
            "w1.weight": ("w13_weight", 0), "w3.weight": ("w13_weight", 1), "w2.weight": ("w2_weight", None),
            "w1.scale": (f"w13_{scale}", 0), "w3.scale": (f"w13_{scale}", 1), "w2.scale": (f"w2_{scale}", None),
        }

    def __repr__(self) -> str:
        return (f"DeepseekV4FP8Config(expert_dtype={self.expert_dtype!r}, quantized={self.quantized}, "
                f"ignored_layers={sorted(self.ignored_layers)})")

