"""Official-format checkpoint writer: quantizes BF16 master weights; random tiny checkpoints for tests.

`write_checkpoint` produces exactly `expected_inventory(cfg)`: FP8 128x128 blocks for every linear
that has a `.scale` in the inventory (E8M0 scales with fp4 experts, float32 with fp8), MXFP4 or
FP8-block routed experts, and every other tensor cast to its inventory dtype.
Spec: checkpoint_format.md §1–§6.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from dsv4.checkpoint.naming import (
    SAFETENSORS_DTYPES, expected_inventory, is_mtp_name, is_routed_expert_name,
)
from dsv4.config import ModelConfig
from dsv4.checkpoint.loader import INDEX_FILE
from dsv4.quant.fp8 import quantize_fp8_block
from dsv4.quant.mxfp4 import quantize_mxfp4

LAYER_KINDS = {"sliding": 0, "swa": 0, "csa": 4, "hca": 128}
# ModelConfig field names that differ from their config.json key (tiny_config accepts both)
_FIELD_TO_KEY = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                 "rope_dim": "qk_rope_head_dim", "window": "sliding_window"}


def parse_layers(spec: str) -> list[int]:
    """"sliding,csa,hca" -> compress ratios [0, 4, 128] (one entry per backbone layer)."""
    kinds = [k.strip().lower() for k in spec.split(",") if k.strip()]
    bad = [k for k in kinds if k not in LAYER_KINDS]
    if not kinds or bad:
        raise ValueError(f"--layers {spec!r}: expected comma-separated kinds from sliding, csa, hca")
    return [LAYER_KINDS[k] for k in kinds]


def tiny_config(expert_dtype: str = "fp4", layers: str = "sliding,csa,hca,csa", *,
                quantized: bool = True, **overrides) -> ModelConfig:
    """A tiny DeepSeek-V4 config: every linear dim a multiple of 128 (whole FP8 tiles), 16 indexer
    heads, vocab 512, index_topk 8, layer 0 hash-routed.

    overrides: config.json keys (or ModelConfig field names such as `window`), e.g.
    `tiny_config(num_hash_layers=2, sliding_window=32)`.
    """
    ratios = parse_layers(layers)
    d = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": len(ratios),
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "qk_rope_head_dim": 64,
        "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128, "sliding_window": 16,
        "compress_ratios": ratios + [0], "num_hash_layers": 1,
        "rope_theta": 10000, "compress_rope_theta": 160000,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576,
        "index_n_heads": 16, "index_head_dim": 128, "index_topk": 8,
        "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "moe_intermediate_size": 128, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "bos_token_id": 0, "eos_token_id": 1, "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
        "expert_dtype": expert_dtype,
    }
    if quantized:
        d["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    overrides = {_FIELD_TO_KEY.get(k, k): v for k, v in overrides.items()}
    for key, value in overrides.items():
        if key not in d and key != "quantization_config":
            raise ValueError(f"tiny_config: unknown config key {key!r}")
        d[key] = value
    if "num_hidden_layers" in overrides and "compress_ratios" not in overrides:
        raise ValueError("tiny_config: set the number of layers through `layers`, not num_hidden_layers")
    return ModelConfig.from_dict(d)


# V4-Pro's shape in tiny: compressed attention from layer 0 (no sliding-only layer) and widths that are not powers
# of two (Pro: hidden 7168, q latent 1536, expert width 3072, 384 experts; here 3 x 128 and 12), 8 heads per output
# group. Kernels that assumed Flash's power-of-two widths failed only on Pro (session 25).
PRO_LAYERS = "hca,hca,csa,hca"
PRO_SHAPE = dict(hidden_size=384, q_lora_rank=384, moe_intermediate_size=384, n_routed_experts=12,
                 num_attention_heads=16, o_groups=2)


def pro_shaped_config(expert_dtype: str = "fp4", **overrides) -> ModelConfig:
    """`tiny_config` with V4-Pro's shape (PRO_LAYERS, PRO_SHAPE); overrides as there."""
    return tiny_config(expert_dtype, PRO_LAYERS, **{**PRO_SHAPE, **overrides})


# ---- random masters -------------------------------------------------------------------------

def init_value(name: str, shape: tuple[int, ...], cfg: ModelConfig, g: torch.Generator) -> torch.Tensor:
    """Initial values (fp32, or int64 for tid2eid) of an unquantised tensor, made on g's device;
    chosen so that activations stay O(1) through a few random layers."""
    leaf = name.rsplit(".", 1)[-1]

    def randn(std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=g, dtype=torch.float32, device=g.device) * std + mean

    if leaf == "tid2eid":  # distinct expert ids per token
        v, k = shape
        return torch.rand(v, cfg.n_routed_experts, generator=g, device=g.device).argsort(dim=1)[:, :k].to(torch.int64)
    if name == "embed.weight":
        return randn()
    if leaf == "attn_sink":
        return randn()
    if leaf == "ape":
        return randn(0.5)
    if leaf == "bias":  # router bias
        return randn(0.01)
    if name.endswith(("_fn", ".fn")):  # mHC mixes ~ N(0, 1) on the RMS-normalised stream
        return randn(1.0 / math.sqrt(shape[1]))
    if name.endswith("_base"):
        return randn(0.1)
    if name.endswith("_scale"):
        return 0.1 + 0.1 * torch.rand(shape, generator=g, device=g.device)
    if len(shape) == 1:  # RMSNorm weights
        return randn(0.05, 1.0)
    return randn(1.0 / math.sqrt(shape[1]))  # linears [out, in], router, head


def random_master_weights(cfg: ModelConfig, seed: int = 0, include_mtp: bool = True) -> dict[str, torch.Tensor]:
    """Random logical weights (official names, per-expert w1/w2/w3 [out, in], no `.scale`).

    Each tensor has the dtype of the unquantized inventory (BF16 / F32 / I64).
    """
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in expected_inventory(cfg, include_mtp=include_mtp, quantized=False).items():
        out[name] = init_value(name, spec.shape, cfg, g).to(SAFETENSORS_DTYPES[spec.dtype][0])
    return out


# ---- writing --------------------------------------------------------------------------------

def quantize_masters(cfg: ModelConfig, masters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Master weights -> the stored tensors of `expected_inventory(cfg)` (ValueError on mismatch)."""
    include_mtp = any(is_mtp_name(n) for n in masters)
    logical = expected_inventory(cfg, include_mtp=include_mtp, quantized=False)
    missing = [n for n in logical if n not in masters]
    extra = [n for n in masters if n not in logical]
    if missing or extra:
        raise ValueError(f"master weights do not match the config: missing {missing[:5]}, "
                         f"unexpected {extra[:5]}")
    stored = expected_inventory(cfg, include_mtp=include_mtp)
    out: dict[str, torch.Tensor] = {}
    for name, w in masters.items():
        if tuple(w.shape) != logical[name].shape:
            raise ValueError(f"master {name}: shape {list(w.shape)}, expected {list(logical[name].shape)}")
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and f"{module}.scale" in stored:
            if is_routed_expert_name(name) and stored[name].dtype == "I8":
                wq, scale = quantize_mxfp4(w, name=name)
            elif is_routed_expert_name(name):
                wq, scale = quantize_fp8_block(w, "float32", name=name)
            else:
                wq, scale = quantize_fp8_block(w, cfg.linear_scale_dtype, name=name)
            out[name], out[f"{module}.scale"] = wq.contiguous(), scale.contiguous()
        else:
            out[name] = w.to(SAFETENSORS_DTYPES[stored[name].dtype][0]).contiguous()
    for name, spec in stored.items():  # the writer's contract: exactly the inventory
        t = out[name]
        if tuple(t.shape) != spec.shape or t.dtype != SAFETENSORS_DTYPES[spec.dtype][0]:
            raise AssertionError(f"{name}: produced {t.dtype} {list(t.shape)}, inventory says {spec}")
    return {name: out[name] for name in stored}


def _official_groups(names: list[str]) -> list[list[str]]:
    """Placement of the released checkpoints: embed | one shard per layer | head, norm, hc_head | mtp."""
    groups: dict[str, list[str]] = {}
    for n in names:
        if n == "embed.weight":
            key = "0"
        elif n.startswith("layers."):
            key = f"1.{int(n.split('.')[1]):06d}"
        elif is_mtp_name(n):
            key = "3"
        else:
            key = "2"
        groups.setdefault(key, []).append(n)
    return [groups[k] for k in sorted(groups)]


def _split(names: list[str], sizes: dict[str, int], num_shards: int | None,
           max_shard_bytes: int | None) -> list[list[str]]:
    if num_shards is None and max_shard_bytes is None:
        return _official_groups(names)
    if max_shard_bytes is not None:
        shards, cur, cur_bytes = [], [], 0
        for n in names:
            if cur and cur_bytes + sizes[n] > max_shard_bytes:
                shards.append(cur)
                cur, cur_bytes = [], 0
            cur.append(n)
            cur_bytes += sizes[n]
        return shards + ([cur] if cur else [])
    if not 1 <= num_shards <= len(names):
        raise ValueError(f"num_shards={num_shards} must be in [1, {len(names)}]")
    target = sum(sizes[n] for n in names) / num_shards
    shards: list[list[str]] = [[]]
    done = 0
    for i, n in enumerate(names):
        shards_left = num_shards - len(shards)
        # start the next shard at each byte boundary, or when every remaining tensor needs its own
        if shards[-1] and shards_left > 0 and (done >= target * len(shards) or len(names) - i <= shards_left):
            shards.append([])
        shards[-1].append(n)
        done += sizes[n]
    return shards


def write_checkpoint(out_dir: str | Path, cfg: ModelConfig, masters: dict[str, torch.Tensor], *,
                     max_shard_bytes: int | None = None, num_shards: int | None = None) -> Path:
    """Quantize `masters` and write an official-format checkpoint directory.

    Writes config.json, generation_config.json, model.safetensors.index.json and the shards
    (default: the released placement, one shard per layer; or `num_shards` / `max_shard_bytes`).
    """
    out = Path(out_dir)
    tensors = quantize_masters(cfg, masters)
    names = list(tensors)
    sizes = {n: tensors[n].numel() * tensors[n].element_size() for n in names}
    shards = _split(names, sizes, num_shards, max_shard_bytes)
    out.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    gen = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": True,
           "temperature": 1.0, "top_p": 1.0}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return out


def make_tiny(out_dir: str | Path, *, expert_dtype: str = "fp4", seed: int = 0,
              layers: str = "sliding,csa,hca,csa", quantized: bool = True, **kw) -> Path:
    """Random tiny checkpoint (the `dsv4 make-tiny` command)."""
    cfg = tiny_config(expert_dtype, layers, quantized=quantized)
    return write_checkpoint(out_dir, cfg, random_master_weights(cfg, seed), **kw)
