"""ModelConfig: legacy keys == transformers-style keys; invalid values name the field.

References: the released configs (fixtures), transformers' own DeepseekV4Config for the
transformers-style spelling, and the values of deepseek_v4_model.md §1.
"""
import copy
import json
from pathlib import Path

import pytest

from dsv4.config import ModelConfig

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "configs"
NAMES = ["deepseek-v4-flash", "deepseek-v4-flash-base", "deepseek-v4-pro"]
# spec §1.1 / §1.2 / §1.5: (layers, hidden, heads, experts, I, routed scale, topk, expert dtype, swa/csa/hca)
SPEC = {
    "deepseek-v4-flash": (43, 4096, 64, 256, 2048, 1.5, 512, "fp4", (2, 21, 20)),
    "deepseek-v4-flash-base": (43, 4096, 64, 256, 2048, 1.5, 512, "fp8", (2, 21, 20)),
    "deepseek-v4-pro": (61, 7168, 128, 384, 3072, 2.5, 1024, "fp4", (0, 30, 31)),
}


def legacy(name: str) -> dict:
    path = FIXTURES / f"{name}.config.json"
    if not path.exists():
        pytest.skip(f"fixture {path} not available")
    return json.loads(path.read_text())


def transformers_style(d: dict, strip_legacy: bool) -> dict:
    transformers = pytest.importorskip("transformers")
    out = transformers.DeepseekV4Config(**copy.deepcopy(d)).to_dict()
    if strip_legacy:  # force the parser onto the transformers spellings only
        for key in ("qk_rope_head_dim", "rope_theta", "compress_rope_theta", "rope_scaling",
                    "expert_dtype", "num_hash_layers", "compress_ratios"):
            out.pop(key, None)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_released_config_values(name):
    cfg = ModelConfig.from_dict(legacy(name))
    layers, hidden, heads, experts, inter, rscale, topk, edtype, kinds = SPEC[name]
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.n_routed_experts) == (layers, hidden, heads, experts)
    assert (cfg.moe_intermediate_size, cfg.routed_scaling_factor, cfg.index_topk) == (inter, rscale, topk)
    assert cfg.expert_dtype == edtype
    assert cfg.linear_scale_dtype == ("e8m0" if edtype == "fp4" else "float32")
    assert tuple(cfg.layer_kind_counts().values()) == kinds
    assert [s.moe for s in cfg.layers[:4]] == ["hash", "hash", "hash", "topk"]
    assert cfg.mtp_layer.is_mtp and cfg.mtp_layer.compress_ratio == 0 and cfg.mtp_layer.moe == "topk"
    assert (cfg.head_dim, cfg.rope_dim, cfg.nope_dim, cfg.hc_mix_dim) == (512, 64, 448, 24)
    assert cfg.yarn is not None and cfg.yarn.factor == 16 and cfg.yarn.original_max_position_embeddings == 65536
    for spec in (*cfg.layers, cfg.mtp_layer):  # §1.1: YaRN + base 160000 only on compressed layers
        compressed = spec.attention != "sliding"
        assert spec.rope.theta == (160000 if compressed else 10000)
        assert spec.rope.yarn == (cfg.yarn if compressed else None)


@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_transformers_keys_give_equal_config(name, strip):
    d = legacy(name)
    a = ModelConfig.from_dict(d)
    b = ModelConfig.from_dict(transformers_style(d, strip))
    assert a == b


@pytest.mark.parametrize("name", NAMES)
def test_to_dict_round_trip_and_from_file(name, tmp_path):
    cfg = ModelConfig.from_dict(legacy(name))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert ModelConfig.from_file(tmp_path) == cfg


BAD = [
    ("expert_dtype", "int4", "expert_dtype"),
    ("model_type", "deepseek_v41", "model_type"),
    ("num_key_value_heads", 2, "num_key_value_heads"),
    ("scoring_func", "softmax", "scoring_func"),
    ("hidden_size", -5, "hidden_size"),
    ("hidden_size", "big", "hidden_size"),
    ("o_groups", 7, "o_groups"),
    ("n_shared_experts", 2, "n_shared_experts"),
    ("num_experts_per_tok", 1000, "num_experts_per_tok"),
    ("routed_scaling_factor", float("nan"), "routed_scaling_factor"),
    ("tie_word_embeddings", True, "tie_word_embeddings"),
    ("compress_ratios", [0, 3] + [4] * 42, "compress_ratios"),
    ("compress_ratios", [0] * 10, "compress_ratios"),
    ("num_hash_layers", 50, "num_hash_layers"),
]


@pytest.mark.parametrize("key,value,field", BAD, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD])
def test_invalid_value_names_the_field(key, value, field):
    d = legacy("deepseek-v4-flash")
    d[key] = value
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_dict(d)


QUANT_BAD = [
    ("quant_method", "awq"), ("weight_block_size", [64, 64]), ("fmt", "e5m2"),
    ("activation_scheme", "static"), ("scale_fmt", "fp32"), ("expert_dtype", "fp16"),
]


@pytest.mark.parametrize("key,value", QUANT_BAD)
def test_invalid_quantization_config_names_the_field(key, value):
    d = legacy("deepseek-v4-flash")
    if key == "expert_dtype":
        del d["expert_dtype"]
    d["quantization_config"][key] = value
    with pytest.raises(ValueError, match=key):
        ModelConfig.from_dict(d)


def test_transformers_style_invalid_values():
    d = transformers_style(legacy("deepseek-v4-flash"), strip_legacy=True)
    bad_types = dict(d, layer_types=d["layer_types"][:-1] + ["full_attention"])
    with pytest.raises(ValueError, match="layer_types"):
        ModelConfig.from_dict(bad_types)
    bad_hash = dict(d, mlp_layer_types=["moe", "hash_moe"] + d["mlp_layer_types"][2:])
    with pytest.raises(ValueError, match="mlp_layer_types"):
        ModelConfig.from_dict(bad_hash)
    no_schedule = {k: v for k, v in d.items() if k != "layer_types"}
    with pytest.raises(ValueError, match="compress_ratios or layer_types"):
        ModelConfig.from_dict(no_schedule)
    conflict = dict(legacy("deepseek-v4-flash"), layer_types=d["layer_types"][::-1])
    with pytest.raises(ValueError, match="disagree"):
        ModelConfig.from_dict(conflict)
    nested_conflict = dict(legacy("deepseek-v4-flash"))
    nested_conflict["quantization_config"] = dict(nested_conflict["quantization_config"], expert_dtype="fp8")
    with pytest.raises(ValueError, match="expert_dtype"):
        ModelConfig.from_dict(nested_conflict)


def test_expert_dtype_resolution():
    d = legacy("deepseek-v4-flash")
    del d["expert_dtype"]
    assert ModelConfig.from_dict(d).expert_dtype == "fp4"  # absent -> fp4 (first Flash upload)
    d["quantization_config"]["expert_dtype"] = "fp8"      # V4.1-style: only inside quantization_config
    assert ModelConfig.from_dict(d).expert_dtype == "fp8"
