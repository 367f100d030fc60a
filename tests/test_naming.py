"""Expected inventory and name mapping against the published totals, the spec tables and transformers.

References: checkpoint_format.md §3 (shapes, hand-typed below), §4 (published/derived totals),
§11 (names), transformers 5.23's own rename rules and module tree.
"""
import functools
import json
import re
from pathlib import Path

import pytest
import torch

from dsv4.checkpoint.naming import (
    TensorSpec, expected_inventory, inventory_summary, is_main_name, is_mtp_name, name_layout,
    official_from_transformers, official_to_transformers, transformers_to_official,
)
from dsv4.checkpoint.writer import tiny_config
from dsv4.config import ModelConfig

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "configs"


def load(name: str) -> ModelConfig:
    p = FIXTURES / f"deepseek-v4-{name}.config.json"
    if not p.exists():
        pytest.skip(f"{p} missing")
    return ModelConfig.from_file(p)


@functools.lru_cache(maxsize=None)
def inventory(name: str, include_mtp: bool = True) -> dict:
    return expected_inventory(load(name), include_mtp=include_mtp)


# checkpoint_format.md §4
TOTALS = {
    "flash": (69187, 159_609_485_896,
              {"BF16": 433, "F32": 417, "F8_E4M3": 375, "F8_E8M0": 34167, "I64": 3, "I8": 33792},
              (1575, 3_593_787_756)),
    "pro": (145116, 864_704_792_696,
            {"BF16": 619, "F32": 590, "F8_E4M3": 528, "F8_E8M0": 71952, "I64": 3, "I8": 71424},
            (2343, 13_956_587_692)),
    "flash-base": (69187, 292_555_345_480, {"BF16": 433, "F32": 34584, "F8_E4M3": 34167, "I64": 3},
                   (1575, 6_615_289_836)),
}


@pytest.mark.parametrize("name", list(TOTALS))
def test_inventory_totals_match_published(name):
    inv = inventory(name)
    count, nbytes, by_dtype, (mtp_count, mtp_bytes) = TOTALS[name]
    s = inventory_summary(inv)
    assert (s["tensors"], s["bytes"]) == (count, nbytes)
    assert s["tensors_by_dtype"] == by_dtype
    mtp = [v for k, v in inv.items() if is_mtp_name(k)]
    assert (len(mtp), sum(v.nbytes for v in mtp)) == (mtp_count, mtp_bytes)
    main = inventory(name, include_mtp=False)
    assert len(main) == count - mtp_count and set(main) == {k for k in inv if is_main_name(k)}


def test_flash_per_block_bytes():
    inv = inventory("flash")

    def block(prefix):
        return sum(v.nbytes for k, v in inv.items() if k.startswith(prefix))
    # §4: SWA hash layer 0, CSA hash layer 2, HCA layer 3, CSA layer 4, mtp.0
    assert [block(f"layers.{i}.") for i in (0, 2, 3, 4)] == [3_566_148_952, 3_596_055_640, 3_568_596_312,
                                                             3_589_851_224]
    assert block("mtp.0.") == 3_593_787_756


# hand-typed from the §3 tables: (name, Flash shape/dtype, Pro shape/dtype)
SPOT = [
    ("embed.weight", ([129280, 4096], "BF16"), ([129280, 7168], "BF16")),
    ("hc_head_fn", ([4, 16384], "F32"), ([4, 28672], "F32")),
    ("hc_head_scale", ([1], "F32"), ([1], "F32")),
    ("layers.5.hc_attn_fn", ([24, 16384], "F32"), ([24, 28672], "F32")),
    ("layers.5.hc_ffn_scale", ([3], "F32"), ([3], "F32")),
    ("layers.5.attn.attn_sink", ([64], "F32"), ([128], "F32")),
    ("layers.5.attn.wq_a.scale", ([8, 32], "F8_E8M0"), ([12, 56], "F8_E8M0")),
    ("layers.5.attn.wq_b.weight", ([32768, 1024], "F8_E4M3"), ([65536, 1536], "F8_E4M3")),
    ("layers.5.attn.wkv.scale", ([4, 32], "F8_E8M0"), ([4, 56], "F8_E8M0")),
    ("layers.5.attn.wo_a.weight", ([8192, 4096], "F8_E4M3"), ([16384, 4096], "F8_E4M3")),
    ("layers.5.attn.wo_b.scale", ([32, 64], "F8_E8M0"), ([56, 128], "F8_E8M0")),
    ("layers.5.ffn.gate.weight", ([256, 4096], "BF16"), ([384, 7168], "BF16")),
    ("layers.5.ffn.gate.bias", ([256], "F32"), ([384], "F32")),
    ("layers.1.ffn.gate.tid2eid", ([129280, 6], "I64"), ([129280, 6], "I64")),
    ("layers.5.ffn.shared_experts.w2.scale", ([32, 16], "F8_E8M0"), ([56, 24], "F8_E8M0")),
    ("layers.3.attn.compressor.ape", ([128, 512], "F32"), ([128, 512], "F32")),
    ("layers.3.attn.compressor.wkv.weight", ([512, 4096], "BF16"), ([512, 7168], "BF16")),
    ("layers.4.attn.compressor.ape", ([4, 1024], "F32"), ([4, 1024], "F32")),
    ("layers.4.attn.compressor.wgate.weight", ([1024, 4096], "BF16"), ([1024, 7168], "BF16")),
    ("layers.4.attn.indexer.wq_b.scale", ([64, 8], "F8_E8M0"), ([64, 12], "F8_E8M0")),
    ("layers.4.attn.indexer.weights_proj.weight", ([64, 4096], "BF16"), ([64, 7168], "BF16")),
    ("layers.4.attn.indexer.compressor.ape", ([4, 256], "F32"), ([4, 256], "F32")),
    ("layers.4.attn.indexer.compressor.norm.weight", ([128], "BF16"), ([128], "BF16")),
    ("layers.9.ffn.experts.17.w1.weight", ([2048, 2048], "I8"), ([3072, 3584], "I8")),
    ("layers.9.ffn.experts.17.w3.scale", ([2048, 128], "F8_E8M0"), ([3072, 224], "F8_E8M0")),
    ("layers.9.ffn.experts.17.w2.weight", ([4096, 1024], "I8"), ([7168, 1536], "I8")),
    ("layers.9.ffn.experts.17.w2.scale", ([4096, 64], "F8_E8M0"), ([7168, 96], "F8_E8M0")),
    ("mtp.0.e_proj.scale", ([32, 32], "F8_E8M0"), ([56, 56], "F8_E8M0")),
    ("mtp.0.hnorm.weight", ([4096], "BF16"), ([7168], "BF16")),
    ("mtp.0.ffn.gate.bias", ([256], "F32"), ([384], "F32")),
    ("mtp.0.hc_head_base", ([4], "F32"), ([4], "F32")),
]


def test_spot_shapes_from_spec_tables():
    flash, pro = inventory("flash"), inventory("pro")
    for name, (fs, fd), (ps, pd) in SPOT:
        assert flash[name] == TensorSpec(tuple(fs), fd), name
        assert pro[name] == TensorSpec(tuple(ps), pd), name
    base = inventory("flash-base")  # §3.6/§3.8: FP8 experts, every scale F32
    assert base["layers.9.ffn.experts.17.w1.weight"] == TensorSpec((2048, 4096), "F8_E4M3")
    assert base["layers.9.ffn.experts.17.w1.scale"] == TensorSpec((16, 32), "F32")
    assert base["layers.9.ffn.experts.17.w2.scale"] == TensorSpec((32, 16), "F32")
    assert base["layers.5.attn.wq_a.scale"] == TensorSpec((8, 32), "F32")
    # no sliding layer in Pro has a compressor; layers 0/1 of Flash are sliding-only (§3.3)
    assert not any(k.startswith(("layers.0.attn.compressor", "layers.1.attn.compressor")) for k in flash)
    assert "layers.0.attn.compressor.ape" in pro and "mtp.0.attn.compressor.ape" not in pro


@pytest.mark.parametrize("seed", range(4))
def test_tiny_inventory_count_formula(seed):
    g = torch.Generator().manual_seed(seed)
    kinds = ["sliding", "csa", "hca"]
    n_layers = int(torch.randint(1, 6, (), generator=g))
    layers = ",".join(kinds[int(i)] for i in torch.randint(0, 3, (n_layers,), generator=g))
    cfg = tiny_config("fp4" if seed % 2 else "fp8", layers, num_hash_layers=min(2, seed % 3, n_layers),
                      n_routed_experts=4 + seed)
    inv = expected_inventory(cfg)
    extras = {0: 0, 128: 4, 4: 11}
    blocks = [*(s.compress_ratio for s in cfg.layers), 0]
    expected = 6 + 10 + sum(29 + 6 * cfg.n_routed_experts + extras[r] for r in blocks)  # §4 formula
    assert len(inv) == expected
    assert sum(k.endswith("tid2eid") for k in inv) == cfg.num_hash_layers


# ---- transformers names ----------------------------------------------------------------------

def _rename_with_transformers_rules(name: str, rules: list) -> str:
    """Apply transformers' own deepseek_v4 rename rules (and the FP8 quantiser's .scale rule) in order."""
    name = re.sub(r"^(.+)\.scale$", r"\1.weight_scale_inv", name)
    for src, dst in rules:
        name = re.sub(src, dst.replace("\\", ""), name)
    return name


def test_names_match_transformers_rename_rules():
    pytest.importorskip("transformers")
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightRenaming
    rules = [(src, dst) for rule in get_checkpoint_conversion_mapping("deepseek_v4")
             if isinstance(rule, WeightRenaming) for src, dst in zip(rule.source_patterns, rule.target_patterns)]
    inv = expected_inventory(tiny_config("fp4", "sliding,csa,hca"), include_mtp=False)
    checked = 0
    for name in inv:
        if ".experts." in name and ".shared_experts." not in name:
            continue
        expected = _rename_with_transformers_rules(name, rules)
        assert official_to_transformers(name, with_model_prefix=False) == expected, name
        checked += 1
    assert checked > 60


def test_names_and_shapes_match_transformers_module_tree():
    transformers = pytest.importorskip("transformers")
    cfg = tiny_config("fp4", "hca,csa,sliding", quantized=False)
    with torch.device("meta"):
        model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**cfg.to_dict()))
    tf = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    inv = expected_inventory(cfg, include_mtp=False)
    ours: dict[str, tuple] = {}
    for name, spec in inv.items():
        ours.setdefault(official_to_transformers(name), []).append((name, spec.shape))
    assert set(ours) == set(tf)
    E, I, D = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    for tname, shape in tf.items():
        if tname.endswith("gate_up_proj"):
            assert shape == (E, 2 * I, D) and len(ours[tname]) == 2 * E
        elif tname.endswith("down_proj") and ".experts." in tname:
            assert shape == (E, D, I) and len(ours[tname]) == E
        else:
            assert ours[tname] == [(ours[tname][0][0], shape)], tname
        # and back again
        back = [n for n, _ in transformers_to_official(tname, shape)]
        assert sorted(back) == sorted(n for n, _ in ours[tname])


def test_merged_experts_split_back():
    g = torch.Generator().manual_seed(1)
    E, I, K = 3, 4, 6
    w1 = [torch.randint(-128, 127, (I, K), generator=g, dtype=torch.int8) for _ in range(E)]
    w3 = [torch.randint(-128, 127, (I, K), generator=g, dtype=torch.int8) for _ in range(E)]
    w2 = [torch.randn(K * 2, I, generator=g) for _ in range(E)]
    s1 = [torch.randn(I, 2, generator=g) for _ in range(E)]
    s3 = [torch.randn(I, 2, generator=g) for _ in range(E)]
    stream = [
        ("model.layers.7.mlp.experts.gate_up_proj", torch.stack([torch.cat([a, b]) for a, b in zip(w1, w3)])),
        ("model.layers.7.mlp.experts.down_proj", torch.stack(w2)),
        ("layers.7.mlp.experts.gate_up_proj_scale_inv", torch.stack([torch.cat([a, b]) for a, b in zip(s1, s3)])),
        ("model.layers.7.self_attn.q_a_proj.weight_scale_inv", s1[0]),
        ("lm_head.weight", w2[1]),
        ("mtp.0.e_proj.weight", w2[2]),
    ]
    out = dict(official_from_transformers(stream))
    assert len(out) == 5 * E + 3  # w1, w3, w2 weights + w1, w3 scales per expert
    for e in range(E):
        assert torch.equal(out[f"layers.7.ffn.experts.{e}.w1.weight"], w1[e])
        assert torch.equal(out[f"layers.7.ffn.experts.{e}.w3.weight"], w3[e])
        assert torch.equal(out[f"layers.7.ffn.experts.{e}.w2.weight"], w2[e])
        assert torch.equal(out[f"layers.7.ffn.experts.{e}.w1.scale"], s1[e])
        assert torch.equal(out[f"layers.7.ffn.experts.{e}.w3.scale"], s3[e])
    assert torch.equal(out["layers.7.attn.wq_a.scale"], s1[0])
    assert torch.equal(out["head.weight"], w2[1]) and torch.equal(out["mtp.0.e_proj.weight"], w2[2])
    with pytest.raises(ValueError, match="gate_up_proj"):
        list(official_from_transformers([("model.layers.0.mlp.experts.gate_up_proj", torch.zeros(2, 3, 4))]))
    with pytest.raises(ValueError, match="not a transformers-layout"):
        list(official_from_transformers([("model.layers.0.mlp.mystery.weight", torch.ones(2))]))


@pytest.mark.parametrize("name,layout", [
    ("embed.weight", "official"), ("layers.3.attn.wq_a.scale", "official"),
    ("layers.3.ffn.experts.12.w2.weight", "official"), ("norm.weight", "either"), ("mtp.0.norm.weight", "either"),
    ("model.norm.weight", "transformers"), ("lm_head.weight", "transformers"),
    ("model.embed_tokens.weight", "transformers"), ("layers.3.self_attn.sinks", "transformers"),
    ("model.layers.3.mlp.experts.gate_up_proj", "transformers"),
    ("model.layers.3.attn.wq_a.weight", None), ("layers.3.attn.mystery.weight", None), ("foo", None),
])
def test_name_layout(name, layout):
    assert name_layout(name) == layout


def test_expected_inventory_json_round_trip():
    inv = expected_inventory(tiny_config())
    d = {k: [list(v.shape), v.dtype] for k, v in inv.items()}
    assert json.loads(json.dumps(d)) == d
