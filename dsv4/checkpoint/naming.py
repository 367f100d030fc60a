"""The one naming table: official DeepSeek-V4 tensor names, their shapes/dtypes, and transformers names.

Model parameters use the official checkpoint names, so the expected inventory of a config is also
the list of parameters the model loads. A transformers-layout checkpoint (`model.layers.N.self_attn…`,
merged `experts.gate_up_proj`, `weight_scale_inv`) is converted to official names here and nowhere
else. Spec: checkpoint_format.md §3 (inventory), §4 (counts), §11 (transformers names).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from dsv4.config import ModelConfig
from dsv4.quant.scheme import DeepseekV4FP8Config

# safetensors dtype string -> (torch dtype, bytes per element)
SAFETENSORS_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2), "F32": (torch.float32, 4),
    "F64": (torch.float64, 8), "F8_E4M3": (torch.float8_e4m3fn, 1), "F8_E5M2": (torch.float8_e5m2, 1),
    "F8_E8M0": (torch.float8_e8m0fnu, 1), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
    "I16": (torch.int16, 2), "I32": (torch.int32, 4), "I64": (torch.int64, 8), "BOOL": (torch.bool, 1),
}
TORCH_TO_SAFETENSORS = {t: name for name, (t, _) in SAFETENSORS_DTYPES.items()}
SCALE_DTYPE = {"e8m0": "F8_E8M0", "float32": "F32"}


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype string

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * SAFETENSORS_DTYPES[self.dtype][1]


def _blocks(n: int, block: int = 128) -> int:
    return -(-n // block)


def is_mtp_name(name: str) -> bool:
    return name.startswith("mtp.")


def is_main_name(name: str) -> bool:
    return not name.startswith("mtp.")


def is_scale_name(name: str) -> bool:
    return name.endswith(".scale")


_EXPERT_NAME = re.compile(r"^(?:layers|mtp)\.\d+\.ffn\.experts\.\d+\.w[123]\.(?:weight|scale)$")


def is_routed_expert_name(name: str) -> bool:
    return bool(_EXPERT_NAME.match(name))


# ---- expected inventory ----------------------------------------------------------------------

class _Inventory:
    def __init__(self, cfg: ModelConfig, scheme: DeepseekV4FP8Config):
        self.cfg, self.scheme = cfg, scheme
        self.linear_scale = SCALE_DTYPE[scheme.linear_scale_dtype]
        self.out: dict[str, TensorSpec] = {}
        self._expert_method: str | None = None

    def add(self, name: str, shape: tuple[int, ...], dtype: str) -> None:
        self.out[name] = TensorSpec(tuple(shape), dtype)

    def linear(self, module: str, n: int, k: int) -> None:
        """A dense linear [n, k]: FP8 block + `.scale` when the scheme quantizes it, else BF16."""
        if self.scheme.get_quant_method(module, "linear") == "fp8_block":
            self.add(f"{module}.weight", (n, k), "F8_E4M3")
            self.add(f"{module}.scale", (_blocks(n), _blocks(k)), self.linear_scale)
        else:
            self.add(f"{module}.weight", (n, k), "BF16")

    def expert_proj(self, module: str, n: int, k: int) -> None:
        if self.scheme.ignored_layers or not self._expert_method:  # per expert only when it can differ
            method = self.scheme.get_quant_method(module, "experts")
            self._expert_method = method if not self.scheme.ignored_layers else None
        else:
            method = self._expert_method
        if method == "mxfp4":
            self.add(f"{module}.weight", (n, k // 2), "I8")
            self.add(f"{module}.scale", (n, k // 32), "F8_E8M0")
        elif method == "fp8_block":
            self.add(f"{module}.weight", (n, k), "F8_E4M3")
            self.add(f"{module}.scale", (_blocks(n), _blocks(k)), "F32")
        else:
            self.add(f"{module}.weight", (n, k), "BF16")

    def hc(self, prefix: str, fn_rows: int, base: int, scale: int) -> None:
        d = self.cfg.hidden_size * self.cfg.hc_mult
        self.add(f"{prefix}fn", (fn_rows, d), "F32")
        self.add(f"{prefix}base", (base,), "F32")
        self.add(f"{prefix}scale", (scale,), "F32")

    def compressor(self, p: str, ratio: int, head_dim: int) -> None:
        c = self.cfg
        coff = 2 if ratio == 4 else 1  # CSA compressors use overlapping windows: two halves
        self.add(f"{p}ape", (ratio, coff * head_dim), "F32")
        self.add(f"{p}wkv.weight", (coff * head_dim, c.hidden_size), "BF16")
        self.add(f"{p}wgate.weight", (coff * head_dim, c.hidden_size), "BF16")
        self.add(f"{p}norm.weight", (head_dim,), "BF16")

    def block(self, p: str, layer_index: int) -> None:
        c = self.cfg
        spec = c.layer(layer_index)
        D, H, Dh, Rq, G, Ro = c.hidden_size, c.num_heads, c.head_dim, c.q_lora_rank, c.o_groups, c.o_lora_rank
        mix = c.hc_mix_dim
        self.hc(f"{p}hc_attn_", mix, mix, 3)
        self.hc(f"{p}hc_ffn_", mix, mix, 3)
        self.add(f"{p}attn_norm.weight", (D,), "BF16")
        self.add(f"{p}ffn_norm.weight", (D,), "BF16")
        a = f"{p}attn."
        self.add(f"{a}attn_sink", (H,), "F32")
        self.linear(f"{a}wq_a", Rq, D)
        self.add(f"{a}q_norm.weight", (Rq,), "BF16")
        self.linear(f"{a}wq_b", H * Dh, Rq)
        self.linear(f"{a}wkv", Dh, D)
        self.add(f"{a}kv_norm.weight", (Dh,), "BF16")
        self.linear(f"{a}wo_a", G * Ro, H * Dh // G)
        self.linear(f"{a}wo_b", D, G * Ro)
        if spec.has_compressor:
            self.compressor(f"{a}compressor.", spec.compress_ratio, Dh)
        if spec.has_indexer:
            self.linear(f"{a}indexer.wq_b", c.index_n_heads * c.index_head_dim, Rq)
            self.add(f"{a}indexer.weights_proj.weight", (c.index_n_heads, D), "BF16")
            self.compressor(f"{a}indexer.compressor.", spec.compress_ratio, c.index_head_dim)
        f = f"{p}ffn."
        E, I = c.n_routed_experts, c.moe_intermediate_size
        self.add(f"{f}gate.weight", (E, D), "BF16")
        if spec.moe == "hash":
            self.add(f"{f}gate.tid2eid", (c.vocab_size, c.num_experts_per_tok), "I64")
        else:
            self.add(f"{f}gate.bias", (E,), "F32")
        for e in range(E):
            self.expert_proj(f"{f}experts.{e}.w1", I, D)
            self.expert_proj(f"{f}experts.{e}.w2", D, I)
            self.expert_proj(f"{f}experts.{e}.w3", I, D)
        if c.n_shared_experts:
            self.linear(f"{f}shared_experts.w1", I, D)
            self.linear(f"{f}shared_experts.w2", D, I)
            self.linear(f"{f}shared_experts.w3", I, D)


def expected_inventory(cfg: ModelConfig, include_mtp: bool = True,
                       quantized: bool | None = None) -> dict[str, TensorSpec]:
    """Every tensor the checkpoint of `cfg` holds: official name -> TensorSpec(shape, dtype).

    quantized=None follows the config (quantization_config present or not); quantized=False gives
    the unquantized layout, which is also the list of logical "master" weights.
    """
    q = cfg.is_quantized if quantized is None else quantized
    scheme = DeepseekV4FP8Config(cfg.expert_dtype,
                                 cfg.quantization.ignored_layers if cfg.quantization else (), q)
    inv = _Inventory(cfg, scheme)
    D, V, hc = cfg.hidden_size, cfg.vocab_size, cfg.hc_mult
    inv.add("embed.weight", (V, D), "BF16")
    for i in range(cfg.num_layers):
        inv.block(f"layers.{i}.", i)
    inv.add("head.weight", (V, D), "BF16")
    inv.add("norm.weight", (D,), "BF16")
    inv.hc("hc_head_", hc, hc, 1)
    if include_mtp and cfg.num_nextn_predict_layers:
        p = "mtp.0."
        inv.block(p, cfg.num_layers)
        inv.linear(f"{p}e_proj", D, D)
        inv.linear(f"{p}h_proj", D, D)
        for n in ("enorm", "hnorm", "norm"):
            inv.add(f"{p}{n}.weight", (D,), "BF16")
        inv.hc(f"{p}hc_head_", hc, hc, 1)
    return inv.out


def inventory_summary(inv: dict[str, TensorSpec]) -> dict:
    by_dtype: dict[str, int] = {}
    count_by_dtype: dict[str, int] = {}
    for spec in inv.values():
        by_dtype[spec.dtype] = by_dtype.get(spec.dtype, 0) + spec.nbytes
        count_by_dtype[spec.dtype] = count_by_dtype.get(spec.dtype, 0) + 1
    return {"tensors": len(inv), "bytes": sum(by_dtype.values()),
            "bytes_by_dtype": dict(sorted(by_dtype.items())),
            "tensors_by_dtype": dict(sorted(count_by_dtype.items()))}


# ---- transformers layout ---------------------------------------------------------------------
# (official, transformers) pairs. Entries without ".weight"/other leaf are linear modules:
# `.weight` maps to `.weight`, `.scale` to `.weight_scale_inv`.
_GLOBAL_PAIRS = (
    ("embed.weight", "embed_tokens.weight"), ("head.weight", "lm_head.weight"),
    ("norm.weight", "norm.weight"), ("hc_head_fn", "hc_head.hc_fn"),
    ("hc_head_base", "hc_head.hc_base"), ("hc_head_scale", "hc_head.hc_scale"),
)
_BLOCK_PAIRS = (
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("attn_norm.weight", "input_layernorm.weight"), ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attn.attn_sink", "self_attn.sinks"),
    ("attn.wq_a", "self_attn.q_a_proj"), ("attn.q_norm.weight", "self_attn.q_a_norm.weight"),
    ("attn.wq_b", "self_attn.q_b_proj"), ("attn.wkv", "self_attn.kv_proj"),
    ("attn.kv_norm.weight", "self_attn.kv_norm.weight"),
    ("attn.wo_a", "self_attn.o_a_proj"), ("attn.wo_b", "self_attn.o_b_proj"),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.wkv", "self_attn.compressor.kv_proj"),
    ("attn.compressor.wgate", "self_attn.compressor.gate_proj"),
    ("attn.compressor.norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("attn.indexer.wq_b", "self_attn.compressor.indexer.q_b_proj"),
    ("attn.indexer.weights_proj", "self_attn.compressor.indexer.scorer.weights_proj"),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.wkv", "self_attn.compressor.indexer.kv_proj"),
    ("attn.indexer.compressor.wgate", "self_attn.compressor.indexer.gate_proj"),
    ("attn.indexer.compressor.norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("ffn.gate.weight", "mlp.gate.weight"), ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"),
    ("ffn.shared_experts.w1", "mlp.shared_experts.gate_proj"),
    ("ffn.shared_experts.w2", "mlp.shared_experts.down_proj"),
    ("ffn.shared_experts.w3", "mlp.shared_experts.up_proj"),
)
_TENSOR_LEAVES = (".weight", ".ape", ".attn_sink", ".bias", ".tid2eid")


def _expand(pairs) -> dict[str, str]:
    """official name -> transformers name, with linear modules expanded to weight/scale."""
    out = {}
    for off, tf in pairs:
        if "." in off and not off.endswith(_TENSOR_LEAVES):  # a linear module
            out[f"{off}.weight"] = f"{tf}.weight"
            out[f"{off}.scale"] = f"{tf}.weight_scale_inv"
        else:
            out[off] = tf
    return out


OFFICIAL_TO_TF_GLOBAL = _expand(_GLOBAL_PAIRS)
OFFICIAL_TO_TF_BLOCK = _expand(_BLOCK_PAIRS)
_TF_TO_OFFICIAL_GLOBAL = {v: k for k, v in OFFICIAL_TO_TF_GLOBAL.items()}
_TF_TO_OFFICIAL_BLOCK = {v: k for k, v in OFFICIAL_TO_TF_BLOCK.items()}
# merged routed experts: transformers leaf -> (official projections in dim-1 order, official leaf)
_TF_EXPERTS = {
    "mlp.experts.gate_up_proj": (("w1", "w3"), "weight"),
    "mlp.experts.down_proj": (("w2",), "weight"),
    "mlp.experts.gate_up_proj_scale_inv": (("w1", "w3"), "scale"),
    "mlp.experts.down_proj_scale_inv": (("w2",), "scale"),
}
_BLOCK = re.compile(r"^(layers\.\d+)\.(.+)$")
_OFFICIAL_EXPERT_LEAF = re.compile(r"^ffn\.experts\.\d+\.w[123]\.(?:weight|scale)$")


@dataclass(frozen=True)
class Part:
    """Which piece of a stored (merged) tensor an official tensor is: tensor[expert][chunk of n_chunks]."""
    expert: int
    chunk: int = 0
    n_chunks: int = 1

    def shape(self, stored_shape: tuple[int, ...]) -> tuple[int, ...]:
        rows = stored_shape[1] // self.n_chunks
        return (rows, *stored_shape[2:])

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """This piece of the full stored tensor."""
        return self.take_from_expert(t[self.expert])

    def take_from_expert(self, row: torch.Tensor) -> torch.Tensor:
        """This piece of `stored[expert]` (what a sliced read returns); a copy, not a view."""
        n = row.shape[0] // self.n_chunks
        return row[self.chunk * n:(self.chunk + 1) * n].clone()


def name_layout(name: str) -> str | None:
    """"official", "transformers", "either" (same in both / MTP namespace) or None (unknown name)."""
    if name.startswith("mtp."):
        return "either"
    stripped = name[6:] if name.startswith("model.") else name
    prefixed = stripped is not name
    if stripped == "lm_head.weight" or stripped in _TF_TO_OFFICIAL_GLOBAL:
        if stripped in OFFICIAL_TO_TF_GLOBAL and not prefixed:
            return "either"  # norm.weight
        return "transformers"
    if stripped in OFFICIAL_TO_TF_GLOBAL:
        return None if prefixed else "official"
    m = _BLOCK.match(stripped)
    if not m:
        return None
    leaf = m.group(2)
    if leaf in _TF_TO_OFFICIAL_BLOCK or leaf in _TF_EXPERTS:
        return "transformers"
    if (leaf in OFFICIAL_TO_TF_BLOCK or _OFFICIAL_EXPERT_LEAF.match(leaf)) and not prefixed:
        return "official"
    return None


def transformers_to_official(name: str, shape: tuple[int, ...]) -> list[tuple[str, Part | None]]:
    """Official tensors held by one transformers-layout tensor (merged experts give several)."""
    stripped = name[6:] if name.startswith("model.") else name
    if stripped in _TF_TO_OFFICIAL_GLOBAL:
        return [(_TF_TO_OFFICIAL_GLOBAL[stripped], None)]
    m = _BLOCK.match(stripped)
    if not m:
        raise ValueError(f"{name}: not a transformers-layout DeepSeek-V4 tensor name")
    block, leaf = m.groups()
    if leaf in _TF_TO_OFFICIAL_BLOCK:
        return [(f"{block}.{_TF_TO_OFFICIAL_BLOCK[leaf]}", None)]
    if leaf in _TF_EXPERTS:
        projs, kind = _TF_EXPERTS[leaf]
        if len(shape) != 3 or shape[1] % len(projs):
            raise ValueError(f"{name}: merged expert tensor has shape {list(shape)}; expected "
                             f"[experts, {'2*' if len(projs) == 2 else ''}rows, cols]")
        return [(f"{block}.ffn.experts.{e}.{p}.{kind}", Part(e, j, len(projs)))
                for e in range(shape[0]) for j, p in enumerate(projs)]
    raise ValueError(f"{name}: not a transformers-layout DeepSeek-V4 tensor name")


def official_from_transformers(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Convert a stream of transformers-layout (name, tensor) pairs to official names.

    Merged `experts.gate_up_proj` [E, 2I, *] is split back into per-expert w1 (rows [0, I)) and w3
    (rows [I, 2I)); `down_proj` into per-expert w2; `weight_scale_inv` becomes `scale`.
    `mtp.*` names pass through unchanged.
    """
    for name, t in items:
        if name.startswith("mtp."):
            yield name, t
            continue
        for official, part in transformers_to_official(name, tuple(t.shape)):
            yield official, (t if part is None else part.take(t))


def official_to_transformers(name: str, with_model_prefix: bool = True) -> str:
    """The transformers name of an official tensor (experts map to their merged tensor)."""
    pre = "model." if with_model_prefix else ""
    if name in OFFICIAL_TO_TF_GLOBAL:
        tf = OFFICIAL_TO_TF_GLOBAL[name]
        return tf if tf == "lm_head.weight" else pre + tf
    m = _BLOCK.match(name)
    if m and m.group(2) in OFFICIAL_TO_TF_BLOCK:
        return f"{pre}{m.group(1)}.{OFFICIAL_TO_TF_BLOCK[m.group(2)]}"
    if m and _OFFICIAL_EXPERT_LEAF.match(m.group(2)):
        proj, kind = m.group(2).split(".")[-2:]
        base = "gate_up_proj" if proj in ("w1", "w3") else "down_proj"
        return f"{pre}{m.group(1)}.mlp.experts.{base}{'_scale_inv' if kind == 'scale' else ''}"
    raise ValueError(f"{name}: no transformers name (MTP tensors are not part of the transformers model)")
