"""`config.json` -> `ModelConfig`: the released ("legacy") keys and the keys transformers writes when it re-saves
a config (`layer_types`, `mlp_layer_types`, `compress_rates`, `partial_rotary_factor`, nested `rope_parameters`).
Every bad field is a ValueError naming it. Spec: deepseek_v4_model.md §1.
"""
from __future__ import annotations

import math
from typing import Any

from dsv4.config import ATTENTION_KINDS, EXPERT_DTYPES, ModelConfig, QuantConfig, Yarn


def _fail(field_name: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"config.json: invalid {field_name}={value!r}; allowed: {allowed}")


def _int(d: dict, key: str, *aliases: str, default: Any = None, minimum: int = 1) -> int:
    for k in (key, *aliases):
        if k in d and d[k] is not None:
            v = d[k]
            if isinstance(v, bool) or not isinstance(v, int) and not (isinstance(v, float) and v.is_integer()):
                raise _fail(k, v, f"an integer >= {minimum}")
            v = int(v)
            if v < minimum:
                raise _fail(k, v, f"an integer >= {minimum}")
            return v
    if default is None:
        raise ValueError(f"config.json: missing required field {key!r}")
    return default


def _float(d: dict, key: str, default: float, positive: bool = True) -> float:
    v = d.get(key, default)
    if v is None:
        v = default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise _fail(key, v, "a finite positive number" if positive else "a finite number")
    return float(v)


def _compress_ratios(d: dict, n_layers: int) -> tuple[int, ...]:
    legacy = d.get("compress_ratios")
    rates = dict(d.get("compress_rates") or {})
    if "compress_rate_csa" in d:
        rates["compressed_sparse_attention"] = d["compress_rate_csa"]
    if "compress_rate_hca" in d:
        rates["heavily_compressed_attention"] = d["compress_rate_hca"]
    csa = rates.get("compressed_sparse_attention", 4)
    hca = rates.get("heavily_compressed_attention", 128)
    if (csa, hca) != (4, 128):
        raise _fail("compress_rates", rates, "compressed_sparse_attention=4, heavily_compressed_attention=128")

    from_types = None
    layer_types = d.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != n_layers:
            raise _fail("layer_types", layer_types, f"a list of {n_layers} entries")
        kind_to_ratio = {"sliding_attention": 0, "compressed_sparse_attention": csa,
                         "heavily_compressed_attention": hca}
        bad = [t for t in layer_types if t not in kind_to_ratio]
        if bad:
            raise _fail("layer_types", bad, ", ".join(kind_to_ratio))
        from_types = [kind_to_ratio[t] for t in layer_types] + [0]

    if legacy is not None:
        if not isinstance(legacy, list) or len(legacy) not in (n_layers, n_layers + 1):
            raise _fail("compress_ratios", legacy, f"a list of {n_layers + 1} entries (one per layer + MTP)")
        bad = [r for r in legacy if r not in ATTENTION_KINDS]
        if bad:
            raise _fail("compress_ratios", bad, "entries from 0, 4, 128")
        ratios = list(legacy) + ([0] if len(legacy) == n_layers else [])
        if ratios[-1] != 0:
            raise _fail("compress_ratios[-1] (MTP block)", ratios[-1], "0")
        if from_types is not None and from_types[:n_layers] != ratios[:n_layers]:
            raise ValueError("config.json: compress_ratios and layer_types disagree")
        return tuple(ratios)
    if from_types is not None:
        return tuple(from_types)
    raise ValueError("config.json: missing layer schedule: need compress_ratios or layer_types")


def _num_hash_layers(d: dict, n_layers: int) -> int:
    if "num_hash_layers" in d and d["num_hash_layers"] is not None:
        return _int(d, "num_hash_layers", minimum=0)
    types = d.get("mlp_layer_types")
    if types is None:
        return 3
    if not isinstance(types, list) or len(types) != n_layers:
        raise _fail("mlp_layer_types", types, f"a list of {n_layers} entries")
    bad = [t for t in types if t not in ("hash_moe", "moe")]
    if bad:
        raise _fail("mlp_layer_types", bad, "hash_moe, moe")
    n_hash = 0
    while n_hash < n_layers and types[n_hash] == "hash_moe":
        n_hash += 1
    if "hash_moe" in types[n_hash:]:
        raise _fail("mlp_layer_types", types, "'hash_moe' entries only as a prefix")
    return n_hash


def _rope(d: dict) -> tuple[float, float, Yarn | None]:
    rp = d.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise _fail("rope_parameters", rp, "a dict")
    main, compress = rp.get("main"), rp.get("compress")
    if isinstance(main, dict) or isinstance(compress, dict):
        main, compress = main or {}, compress or {}
        scaling = compress
    else:  # flat rope_parameters behaves like rope_scaling (vLLM's shim does the same)
        main, compress = {}, {}
        scaling = d.get("rope_scaling") or rp
    theta = _float({"rope_theta": main.get("rope_theta", d.get("rope_theta", 10000.0))}, "rope_theta", 10000.0)
    ctheta = _float({"compress_rope_theta": compress.get("rope_theta", d.get("compress_rope_theta", 160000.0))},
                    "compress_rope_theta", 160000.0)
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    if kind in (None, "default") and not (scaling and "factor" in scaling and kind is None):
        return theta, ctheta, None
    if kind not in ("yarn", None):
        raise _fail("rope_scaling.type", kind, "yarn, default")
    yarn = Yarn(
        factor=_float(scaling, "factor", 1.0),
        original_max_position_embeddings=_int(scaling, "original_max_position_embeddings", default=65536),
        beta_fast=_float(scaling, "beta_fast", 32.0),
        beta_slow=_float(scaling, "beta_slow", 1.0),
    )
    af = scaling.get("attention_factor")
    if af not in (None, 1, 1.0):
        raise _fail("rope_parameters.compress.attention_factor", af, "1.0 (DeepSeek-V4 uses no YaRN mscale)")
    return theta, ctheta, yarn


def resolve_expert_dtype(d: dict) -> str:
    """`expert_dtype` of the *model's* config: top level or quantization_config, default fp4."""
    top = d.get("expert_dtype")
    qc = d.get("quantization_config") or {}
    nested = qc.get("expert_dtype") if isinstance(qc, dict) else None
    if top is not None and nested is not None and top != nested:
        raise ValueError(f"config.json: expert_dtype={top!r} disagrees with "
                         f"quantization_config.expert_dtype={nested!r}")
    value = top if top is not None else nested
    if value is None:
        value = "fp4"
    if value not in EXPERT_DTYPES:
        raise _fail("expert_dtype", value, ", ".join(EXPERT_DTYPES))
    return value


def _quant(d: dict) -> QuantConfig | None:
    qc = d.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise _fail("quantization_config", qc, "a dict")
    method = qc.get("quant_method")
    if method not in ("fp8", "deepseek_v4_fp8"):
        raise _fail("quantization_config.quant_method", method, "fp8, deepseek_v4_fp8")
    block = tuple(qc.get("weight_block_size") or (128, 128))
    if block != (128, 128):
        raise _fail("quantization_config.weight_block_size", list(block), "[128, 128]")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _fail("quantization_config.fmt", fmt, "e4m3")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise _fail("quantization_config.activation_scheme", scheme, "dynamic")
    scale_fmt = qc.get("scale_fmt")
    if scale_fmt not in (None, "ue8m0"):
        raise _fail("quantization_config.scale_fmt", scale_fmt, "ue8m0 or absent")
    ignored = list(qc.get("ignored_layers") or []) + list(qc.get("modules_to_not_convert") or [])
    return QuantConfig(method, block, scale_fmt, scheme, tuple(ignored))


def parse_config(d: dict) -> ModelConfig:
    if not isinstance(d, dict):
        raise ValueError("config.json: top level must be an object")
    mt = d.get("model_type")
    if mt != "deepseek_v4":
        raise _fail("model_type", mt, "deepseek_v4")
    n_layers = _int(d, "num_hidden_layers", "n_layers")
    hidden = _int(d, "hidden_size", "dim")
    heads = _int(d, "num_attention_heads", "n_heads")
    head_dim = _int(d, "head_dim", default=512)
    if "qk_rope_head_dim" in d:
        rope_dim = _int(d, "qk_rope_head_dim", "rope_head_dim")
    elif d.get("partial_rotary_factor") is not None:
        rope_dim = round(head_dim * float(d["partial_rotary_factor"]))
    else:
        rope_dim = _int(d, "rope_head_dim", default=64)
    if rope_dim % 2 or rope_dim >= head_dim:
        raise _fail("qk_rope_head_dim", rope_dim, f"an even number < head_dim ({head_dim})")
    kv_heads = d.get("num_key_value_heads", 1)
    if kv_heads != 1:
        raise _fail("num_key_value_heads", kv_heads, "1 (one shared K=V head)")
    o_groups = _int(d, "o_groups", default=8)
    if heads % o_groups:
        raise _fail("o_groups", o_groups, f"a divisor of num_attention_heads ({heads})")
    scoring = d.get("scoring_func", d.get("score_func", "sqrtsoftplus"))
    if scoring != "sqrtsoftplus":
        raise _fail("scoring_func", scoring, "sqrtsoftplus")
    n_experts = _int(d, "n_routed_experts", "num_local_experts")
    topk = _int(d, "num_experts_per_tok", "n_activated_experts")
    if topk > n_experts:
        raise _fail("num_experts_per_tok", topk, f"<= n_routed_experts ({n_experts})")
    n_shared = _int(d, "n_shared_experts", default=1, minimum=0)
    if n_shared > 1:
        raise _fail("n_shared_experts", n_shared, "0 or 1")
    n_mtp = _int(d, "num_nextn_predict_layers", "n_mtp_layers", default=1, minimum=0)
    if n_mtp > 1:
        raise _fail("num_nextn_predict_layers", n_mtp, "0 or 1")
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise _fail("hidden_act", act, "silu")
    if d.get("tie_word_embeddings", False):
        raise _fail("tie_word_embeddings", True, "false")
    eos = d.get("eos_token_id", 1)
    if isinstance(eos, list):
        eos = eos[0]
    theta, ctheta, yarn = _rope(d)
    index_head_dim = _int(d, "index_head_dim", default=128)
    if index_head_dim <= rope_dim:
        raise _fail("index_head_dim", index_head_dim, f"> qk_rope_head_dim ({rope_dim})")
    cfg = ModelConfig(
        vocab_size=_int(d, "vocab_size"),
        hidden_size=hidden,
        num_layers=n_layers,
        num_heads=heads,
        head_dim=head_dim,
        rope_dim=rope_dim,
        q_lora_rank=_int(d, "q_lora_rank"),
        o_groups=o_groups,
        o_lora_rank=_int(d, "o_lora_rank", default=1024),
        window=_int(d, "sliding_window", "window_size", default=128),
        compress_ratios=_compress_ratios(d, n_layers),
        num_hash_layers=_num_hash_layers(d, n_layers),
        rope_theta=theta,
        compress_rope_theta=ctheta,
        yarn=yarn,
        max_position_embeddings=_int(d, "max_position_embeddings", default=1048576),
        index_n_heads=_int(d, "index_n_heads", default=64),
        index_head_dim=index_head_dim,
        index_topk=_int(d, "index_topk", default=512),
        n_routed_experts=n_experts,
        n_shared_experts=n_shared,
        num_experts_per_tok=topk,
        moe_intermediate_size=_int(d, "moe_intermediate_size", "moe_inter_dim"),
        scoring_func=scoring,
        norm_topk_prob=bool(d.get("norm_topk_prob", True)),
        routed_scaling_factor=_float(d, "routed_scaling_factor", 1.0),
        swiglu_limit=_float(d, "swiglu_limit", 10.0),
        hc_mult=_int(d, "hc_mult", default=4),
        hc_sinkhorn_iters=_int(d, "hc_sinkhorn_iters", default=20),
        hc_eps=_float(d, "hc_eps", 1e-6),
        rms_norm_eps=_float(d, "rms_norm_eps", 1e-6),
        bos_token_id=int(d.get("bos_token_id", 0)),
        eos_token_id=int(eos),
        num_nextn_predict_layers=n_mtp,
        tie_word_embeddings=False,
        expert_dtype=resolve_expert_dtype(d),
        quantization=_quant(d),
        raw=dict(d),
    )
    if cfg.num_hash_layers > n_layers:
        raise _fail("num_hash_layers", cfg.num_hash_layers, f"<= num_hidden_layers ({n_layers})")
    return cfg
