"""The deepseek_v4_fp8 scheme: override rule, expert dtype, per-module methods, ignored layers.

Reference: checkpoint_format.md §3 (which linears carry a `.scale`), §3.6/§3.8 (expert formats),
deepseek_v4_model.md §1.4 (expert_dtype), and vLLM's documented override / fused-shard rules.
"""
import logging
from pathlib import Path

import pytest

from dsv4.checkpoint.naming import expected_inventory
from dsv4.config import ModelConfig
from dsv4.checkpoint.writer import tiny_config
from dsv4.quant import scheme
from dsv4.quant.scheme import DeepseekV4FP8Config, override

FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}


@pytest.mark.parametrize("quant_cfg,user,model_type,expected", [
    (FP8, None, "deepseek_v4", "deepseek_v4_fp8"),
    ({"quant_method": "deepseek_v4_fp8"}, None, "deepseek_v4", "deepseek_v4_fp8"),
    (FP8, "deepseek_v4_fp8", "llama", "deepseek_v4_fp8"),
    (FP8, None, "deepseek_v3", None),
    (FP8, "fp8", "deepseek_v3", None),
    ({"quant_method": "deepseek_v4_fp8"}, None, "llama", None),
    ({"quant_method": "awq"}, "deepseek_v4_fp8", "deepseek_v4", None),
    (None, "deepseek_v4_fp8", "deepseek_v4", None),
])
def test_override(quant_cfg, user, model_type, expected):
    assert override(quant_cfg, user, model_type) == expected


def raw_config(**top) -> dict:
    d = tiny_config().to_dict()
    d.pop("expert_dtype")
    d.update(top)
    return d


def test_expert_dtype_from_model_config_and_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(scheme, "_logged", set())
    with caplog.at_level(logging.INFO, logger="dsv4.quant.scheme"):
        assert DeepseekV4FP8Config.from_config(raw_config()).expert_dtype == "fp4"  # default
        assert DeepseekV4FP8Config.from_config(raw_config()).expert_dtype == "fp4"
        d = raw_config()
        d["quantization_config"]["expert_dtype"] = "fp8"
        assert DeepseekV4FP8Config.from_config(d).expert_dtype == "fp8"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("expert_dtype=fp4" in m for m in messages) == 1
    assert sum("expert_dtype=fp8" in m for m in messages) == 1
    for bad in ("int4", "mxfp4", "bf16"):
        with pytest.raises(ValueError, match=r"fp4, fp8"):
            DeepseekV4FP8Config.from_config(raw_config(expert_dtype=bad))
        with pytest.raises(ValueError, match=r"fp4, fp8"):
            DeepseekV4FP8Config(expert_dtype=bad)


@pytest.mark.parametrize("edt,scale", [("fp4", "e8m0"), ("fp8", "float32")])
def test_linear_scale_dtype(edt, scale):
    s = DeepseekV4FP8Config.from_config(tiny_config(edt))
    assert s.linear_scale_dtype == scale == tiny_config(edt).linear_scale_dtype


# checkpoint_format.md §3.2/§3.5/§3.7: modules with a `.scale` (FP8) and those stored BF16
FP8_MODULES = ["layers.2.attn.wq_a", "layers.2.attn.wq_b", "layers.2.attn.wkv", "layers.2.attn.wo_a",
               "layers.2.attn.wo_b", "layers.2.attn.indexer.wq_b", "layers.7.ffn.shared_experts.w1",
               "layers.7.ffn.shared_experts.w2", "layers.7.ffn.shared_experts.w3", "mtp.0.e_proj",
               "mtp.0.h_proj", "mtp.0.attn.wq_a", "model.layers.1.attn.wo_b"]
BF16_MODULES = ["embed", "head", "layers.2.attn.compressor.wkv", "layers.2.attn.compressor.wgate",
                "layers.2.attn.indexer.weights_proj", "layers.2.attn.indexer.compressor.wkv",
                "layers.2.ffn.gate", "e_proj"]


@pytest.mark.parametrize("edt", ["fp4", "fp8"])
def test_methods_per_module(edt):
    s = DeepseekV4FP8Config(edt)
    for m in FP8_MODULES:
        assert s.get_quant_method(m, "linear") == "fp8_block", m
    for m in BF16_MODULES:
        assert s.get_quant_method(m, "linear") == "unquantized", m
    for m in ("layers.0.ffn.experts", "layers.0.ffn.experts.5", "mtp.0.ffn.experts.3.w2"):
        assert s.get_quant_method(m, "experts") == ("mxfp4" if edt == "fp4" else "fp8_block")
    assert s.get_quant_method("layers.0.ffn.shared_experts.w13", "linear") == "fp8_block"  # fused w1+w3
    assert s.get_quant_method("layers.0.attn.wq_a_wkv", "linear") == "fp8_block"
    with pytest.raises(ValueError, match="routed-expert"):
        s.get_quant_method("layers.0.ffn.gate", "experts")
    with pytest.raises(ValueError, match="kind"):
        s.get_quant_method("layers.0.attn.wq_a", "conv")
    unq = DeepseekV4FP8Config(edt, quantized=False)
    assert {unq.get_quant_method(m, "linear") for m in FP8_MODULES} == {"unquantized"}
    assert unq.get_quant_method("layers.0.ffn.experts.1", "experts") == "unquantized"


def test_ignored_layers_and_fused_shards():
    s = DeepseekV4FP8Config("fp4", ["layers.0.attn.wq_a", "model.layers.1.ffn.shared_experts.w1",
                                    "layers.1.ffn.shared_experts.w3", "layers.2.ffn.experts",
                                    "layers.3.attn"])
    assert s.get_quant_method("layers.0.attn.wq_a", "linear") == "unquantized"
    assert s.get_quant_method("layers.0.attn.wq_b", "linear") == "fp8_block"
    assert s.get_quant_method("layers.1.ffn.shared_experts.w13", "linear") == "unquantized"
    assert s.get_quant_method("layers.2.ffn.experts.4.w1", "experts") == "unquantized"
    assert s.get_quant_method("layers.3.ffn.experts.4.w1", "experts") == "mxfp4"
    assert s.get_quant_method("layers.3.attn.wq_a_wkv", "linear") == "unquantized"  # parent ignored
    with pytest.raises(ValueError, match="some but not all shards"):
        s.get_quant_method("layers.0.attn.wq_a_wkv", "linear")  # wq_a ignored, wkv not
    with pytest.raises(ValueError, match="some but not all shards"):
        DeepseekV4FP8Config("fp8", ["layers.5.ffn.shared_experts.w3"]).get_quant_method(
            "layers.5.ffn.shared_experts.w13", "linear")


def test_ignored_layers_from_config_shape_the_inventory():
    qc = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
          "activation_scheme": "dynamic", "ignored_layers": ["layers.0.attn.wo_a"],
          "modules_to_not_convert": ["layers.1.ffn.shared_experts", "layers.2.ffn.experts.3"]}
    cfg = tiny_config(quantization_config=qc)
    assert set(cfg.quantization.ignored_layers) >= {"layers.0.attn.wo_a", "layers.1.ffn.shared_experts"}
    inv = expected_inventory(cfg)
    assert inv["layers.0.attn.wo_a.weight"].dtype == "BF16" and "layers.0.attn.wo_a.scale" not in inv
    assert inv["layers.1.attn.wo_a.weight"].dtype == "F8_E4M3" and "layers.1.attn.wo_a.scale" in inv
    for w in ("w1", "w2", "w3"):
        assert inv[f"layers.1.ffn.shared_experts.{w}.weight"].dtype == "BF16"
        assert inv[f"layers.2.ffn.experts.3.{w}.weight"].dtype == "BF16"
        assert inv[f"layers.2.ffn.experts.4.{w}.weight"].dtype == "I8"
    assert inv["layers.2.ffn.experts.3.w1.weight"].shape == (128, 256)  # logical [I, D], unpacked


def test_unquantized_config_has_no_scales():
    cfg = tiny_config(quantized=False)
    assert not cfg.is_quantized and DeepseekV4FP8Config.from_config(cfg).quantized is False
    inv = expected_inventory(cfg)
    assert not [n for n in inv if n.endswith(".scale")]
    assert {s.dtype for s in inv.values()} == {"BF16", "F32", "I64"}


def test_checkpoint_name_mapping_follows_expert_dtype():
    m4 = DeepseekV4FP8Config("fp4").checkpoint_name_mapping()
    m8 = DeepseekV4FP8Config("fp8").checkpoint_name_mapping()
    assert m4["w1.weight"] == m8["w1.weight"] == ("w13_weight", 0)
    assert m4["w3.weight"] == ("w13_weight", 1) and m4["w2.weight"] == ("w2_weight", None)
    assert m4["w3.scale"] == ("w13_weight_scale", 1)
    assert m8["w3.scale"] == ("w13_weight_scale_inv", 1)


def test_from_config_matches_released_flash_base():
    p = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "configs" / "deepseek-v4-flash-base.config.json"
    if not p.exists():
        pytest.skip("fixture missing")
    s = DeepseekV4FP8Config.from_config(ModelConfig.from_file(p))
    assert (s.expert_dtype, s.linear_scale_dtype, s.quantized) == ("fp8", "float32", True)
