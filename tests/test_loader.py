"""Loader: checkpoints written by another tool (plain safetensors.save_file, names and shapes typed from
checkpoint_format.md §3 here, not taken from dsv4.checkpoint.naming) load bit-exactly, in the
official and the transformers layout (§11 renaming done here); streaming stays within a RAM bound.
"""
import json
import logging
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dsv4.checkpoint import Checkpoint, CheckpointError, load_state
from dsv4.checkpoint.naming import is_main_name
from dsv4.checkpoint.writer import random_master_weights, tiny_config, write_checkpoint

# ---- an independent "other tool": hand-written config + inventory from the spec tables ----------
D, H, DH, RQ, G, RO, E, I, V, K, IH, IHD, HC = 128, 2, 128, 128, 2, 128, 4, 128, 256, 2, 4, 128, 4
RATIOS = [0, 4, 128]  # sliding, CSA, HCA; + MTP block (0)


def foreign_config(expert_dtype: str) -> dict:
    return {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": V,
        "hidden_size": D, "num_hidden_layers": 3, "num_attention_heads": H, "num_key_value_heads": 1,
        "head_dim": DH, "qk_rope_head_dim": 64, "q_lora_rank": RQ, "o_groups": G, "o_lora_rank": RO,
        "sliding_window": 8, "compress_ratios": RATIOS + [0], "num_hash_layers": 1,
        "index_n_heads": IH, "index_head_dim": IHD, "index_topk": 4, "n_routed_experts": E,
        "n_shared_experts": 1, "num_experts_per_tok": K, "moe_intermediate_size": I,
        "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5, "num_nextn_predict_layers": 1,
        "expert_dtype": expert_dtype,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    }


def foreign_tensors(expert_dtype: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scale_f32 = expert_dtype == "fp8"

    def bf16(*s):
        return torch.randn(s, generator=g).to(torch.bfloat16)

    def f32(*s):
        return torch.randn(s, generator=g)

    def e4m3(*s):  # random non-NaN e4m3 bytes
        b = torch.randint(0, 256, s, generator=g, dtype=torch.uint8)
        return torch.where((b & 0x7F) == 0x7F, b & 0xF0, b).view(torch.float8_e4m3fn)

    def e8m0(*s):
        return torch.randint(110, 135, s, generator=g, dtype=torch.uint8).view(torch.float8_e8m0fnu)

    def pow2(*s):
        return torch.pow(2.0, torch.randint(-12, 2, s, generator=g).float())

    t: dict[str, torch.Tensor] = {}

    def linear(name, n, k):
        t[f"{name}.weight"] = e4m3(n, k)
        t[f"{name}.scale"] = pow2(-(-n // 128), -(-k // 128)) if scale_f32 else e8m0(-(-n // 128), -(-k // 128))

    def expert(name, n, k):
        if expert_dtype == "fp4":
            t[f"{name}.weight"] = torch.randint(-128, 128, (n, k // 2), generator=g, dtype=torch.int8)
            t[f"{name}.scale"] = e8m0(n, k // 32)
        else:
            t[f"{name}.weight"] = e4m3(n, k)
            t[f"{name}.scale"] = pow2(n // 128, k // 128)

    def compressor(p, ratio, hd):
        c = 2 if ratio == 4 else 1
        t[p + "ape"], t[p + "wkv.weight"], t[p + "wgate.weight"] = f32(ratio, c * hd), bf16(c * hd, D), bf16(c * hd, D)
        t[p + "norm.weight"] = bf16(hd)

    def block(p, ratio, hash_layer):
        for s in ("attn", "ffn"):
            t[f"{p}hc_{s}_fn"], t[f"{p}hc_{s}_base"], t[f"{p}hc_{s}_scale"] = f32(24, HC * D), f32(24), f32(3)
        t[p + "attn_norm.weight"], t[p + "ffn_norm.weight"], t[p + "attn.attn_sink"] = bf16(D), bf16(D), f32(H)
        linear(p + "attn.wq_a", RQ, D)
        t[p + "attn.q_norm.weight"] = bf16(RQ)
        linear(p + "attn.wq_b", H * DH, RQ)
        linear(p + "attn.wkv", DH, D)
        t[p + "attn.kv_norm.weight"] = bf16(DH)
        linear(p + "attn.wo_a", G * RO, H * DH // G)
        linear(p + "attn.wo_b", D, G * RO)
        if ratio:
            compressor(p + "attn.compressor.", ratio, DH)
        if ratio == 4:
            linear(p + "attn.indexer.wq_b", IH * IHD, RQ)
            t[p + "attn.indexer.weights_proj.weight"] = bf16(IH, D)
            compressor(p + "attn.indexer.compressor.", 4, IHD)
        t[p + "ffn.gate.weight"] = bf16(E, D)
        if hash_layer:
            t[p + "ffn.gate.tid2eid"] = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(V)])
        else:
            t[p + "ffn.gate.bias"] = f32(E)
        for e in range(E):
            expert(f"{p}ffn.experts.{e}.w1", I, D)
            expert(f"{p}ffn.experts.{e}.w2", D, I)
            expert(f"{p}ffn.experts.{e}.w3", I, D)
        for w, (n, k) in (("w1", (I, D)), ("w2", (D, I)), ("w3", (I, D))):
            linear(f"{p}ffn.shared_experts.{w}", n, k)

    t["embed.weight"] = bf16(V, D)
    for i, r in enumerate(RATIOS):
        block(f"layers.{i}.", r, i == 0)
    t["head.weight"], t["norm.weight"] = bf16(V, D), bf16(D)
    t["hc_head_fn"], t["hc_head_base"], t["hc_head_scale"] = f32(HC, HC * D), f32(HC), f32(1)
    block("mtp.0.", 0, False)
    linear("mtp.0.e_proj", D, D)
    linear("mtp.0.h_proj", D, D)
    for n in ("enorm", "hnorm", "norm"):
        t[f"mtp.0.{n}.weight"] = bf16(D)
    t["mtp.0.hc_head_fn"], t["mtp.0.hc_head_base"], t["mtp.0.hc_head_scale"] = f32(HC, HC * D), f32(HC), f32(1)
    return t


def save_foreign(path: Path, tensors: dict, config: dict, *, index: bool = True, n_shards: int = 2) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    weight_map = {}
    for s in range(n_shards):
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s::n_shards]}
        save_file(part, str(path / fname))
        weight_map.update({n: fname for n in part})
    if index:
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(config))
    return path


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


@pytest.mark.parametrize("expert_dtype", ["fp4", "fp8"])
@pytest.mark.parametrize("index", [True, False])
def test_foreign_official_checkpoint_loads_exactly(tmp_path, expert_dtype, index):
    tensors = foreign_tensors(expert_dtype)
    path = save_foreign(tmp_path / "ckpt", tensors, foreign_config(expert_dtype), index=index)
    ckpt = Checkpoint.open(path, progress=False)
    assert ckpt.layout == "official" and ckpt.expert_dtype == expert_dtype and ckpt.include_mtp
    assert set(ckpt.tensor_names) == set(tensors)
    got = dict(ckpt.iter_tensors())
    assert got.keys() == tensors.keys()
    assert all(same(got[n], tensors[n]) for n in tensors)
    assert same(ckpt.get("layers.1.attn.indexer.wq_b.scale"), tensors["layers.1.attn.indexer.wq_b.scale"])
    # MTP filters: skipped for the main model, loadable on its own
    main = dict(ckpt.iter_tensors(is_main_name))
    mtp = dict(ckpt.iter_tensors("mtp."))
    assert set(main) | set(mtp) == set(tensors) and not set(main) & set(mtp) and len(mtp) == 29 + 6 * E + 10
    no_mtp = Checkpoint.open(path, include_mtp=False, progress=False)
    assert not [n for n in no_mtp.tensor_names if n.startswith("mtp.")]


TF_GLOBAL = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
             "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
             "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}
TF_BLOCK = [  # checkpoint_format.md §11, applied to the part after "layers.N."
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("attn_norm.", "input_layernorm."), ("ffn_norm.", "post_attention_layernorm."),
    ("attn.attn_sink", "self_attn.sinks"), ("attn.wq_a.", "self_attn.q_a_proj."),
    ("attn.q_norm.", "self_attn.q_a_norm."), ("attn.wq_b.", "self_attn.q_b_proj."),
    ("attn.wkv.", "self_attn.kv_proj."), ("attn.kv_norm.", "self_attn.kv_norm."),
    ("attn.wo_a.", "self_attn.o_a_proj."), ("attn.wo_b.", "self_attn.o_b_proj."),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.wkv.", "self_attn.compressor.kv_proj."),
    ("attn.compressor.wgate.", "self_attn.compressor.gate_proj."),
    ("attn.compressor.norm.", "self_attn.compressor.kv_norm."),
    ("attn.indexer.wq_b.", "self_attn.compressor.indexer.q_b_proj."),
    ("attn.indexer.weights_proj.", "self_attn.compressor.indexer.scorer.weights_proj."),
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.wkv.", "self_attn.compressor.indexer.kv_proj."),
    ("attn.indexer.compressor.wgate.", "self_attn.compressor.indexer.gate_proj."),
    ("attn.indexer.compressor.norm.", "self_attn.compressor.indexer.kv_norm."),
    ("ffn.gate.weight", "mlp.gate.weight"), ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"),
    ("ffn.gate.tid2eid", "mlp.gate.tid2eid"), ("ffn.shared_experts.w1.", "mlp.shared_experts.gate_proj."),
    ("ffn.shared_experts.w3.", "mlp.shared_experts.up_proj."),
    ("ffn.shared_experts.w2.", "mlp.shared_experts.down_proj."),
]


def to_transformers_layout(t: dict, prefix: str) -> dict:
    out = {}
    for name, x in t.items():
        if name.startswith("mtp.") or ".experts." in name and ".shared_experts." not in name:
            continue  # transformers drops mtp.*; experts are merged below
        if name in TF_GLOBAL:
            new = TF_GLOBAL[name]
            new = new if new == "lm_head.weight" else prefix + new[len("model."):]
        else:
            _, n, rest = name.split(".", 2)
            for a, b in TF_BLOCK:
                if rest.startswith(a):
                    rest = b + rest[len(a):]
                    break
            else:
                raise AssertionError(name)
            if rest.endswith(".scale") and not rest.endswith("hc.scale"):
                rest = rest[: -len(".scale")] + ".weight_scale_inv"
            new = f"{prefix}layers.{n}.{rest}"
        out[new] = x
    for layer in range(len(RATIOS)):
        p = f"layers.{layer}.ffn.experts"
        for kind, suffix in (("weight", ""), ("scale", "_scale_inv")):
            out[f"{prefix}layers.{layer}.mlp.experts.gate_up_proj{suffix}"] = torch.stack(
                [torch.cat([t[f"{p}.{e}.w1.{kind}"], t[f"{p}.{e}.w3.{kind}"]]) for e in range(E)])
            out[f"{prefix}layers.{layer}.mlp.experts.down_proj{suffix}"] = torch.stack(
                [t[f"{p}.{e}.w2.{kind}"] for e in range(E)])
    return out


@pytest.mark.parametrize("expert_dtype,prefix", [("fp4", "model."), ("fp8", "model."), ("fp4", "")])
def test_transformers_layout_checkpoint_loads(tmp_path, expert_dtype, prefix):
    tensors = foreign_tensors(expert_dtype, seed=2)
    tf = to_transformers_layout(tensors, prefix)
    path = save_foreign(tmp_path / "tf", tf, foreign_config(expert_dtype), n_shards=3)
    ckpt = Checkpoint.open(path, include_mtp=None, progress=False)
    assert ckpt.layout == "transformers" and not ckpt.include_mtp
    got = dict(ckpt.iter_tensors())
    want = {n: x for n, x in tensors.items() if not n.startswith("mtp.")}
    assert got.keys() == want.keys()
    assert all(same(got[n], want[n]) for n in want)
    with pytest.raises(CheckpointError, match="missing tensors: mtp.0.*include_mtp=False"):
        Checkpoint.open(path, include_mtp=True, progress=False)


def test_mixed_naming_is_an_error(tmp_path):
    t = foreign_tensors("fp4")
    t["model.layers.0.self_attn.sinks"] = t.pop("layers.0.attn.attn_sink")
    path = save_foreign(tmp_path / "mixed", t, foreign_config("fp4"))
    with pytest.raises(CheckpointError, match=r"mixed tensor naming.*layers.0.self_attn.sinks"):
        Checkpoint.open(path, progress=False)


@pytest.mark.parametrize("stored,claimed", [("fp8", "fp4"), ("fp4", "fp8")])
def test_header_expert_dtype_wins_over_config(tmp_path, caplog, stored, claimed):
    tensors = foreign_tensors(stored)
    path = save_foreign(tmp_path / "x", tensors, foreign_config(claimed))
    with caplog.at_level(logging.WARNING):
        ckpt = Checkpoint.open(path, progress=False)
    assert ckpt.expert_dtype == stored and ckpt.config.expert_dtype == stored
    assert ckpt.config.linear_scale_dtype == ("e8m0" if stored == "fp4" else "float32")
    assert any("header wins" in r.getMessage() for r in caplog.records)
    assert same(ckpt.get("layers.2.ffn.experts.3.w2.weight"), tensors["layers.2.ffn.experts.3.w2.weight"])


def test_e8m0_stored_as_raw_uint8_is_accepted(tmp_path):
    tensors = foreign_tensors("fp4")
    stored = dict(tensors, **{"layers.1.attn.wkv.scale": tensors["layers.1.attn.wkv.scale"].view(torch.uint8)})
    ckpt = Checkpoint.open(save_foreign(tmp_path / "u8", stored, foreign_config("fp4")), progress=False)
    got = ckpt.get("layers.1.attn.wkv.scale")
    assert got.dtype == torch.float8_e8m0fnu and same(got, tensors["layers.1.attn.wkv.scale"])


def test_later_variant_drafter_is_ignored_with_warning(tmp_path, caplog):
    tensors = foreign_tensors("fp4")
    extra = {"mtp.1.attn_norm.weight": torch.randn(D).bfloat16(), "mtp.0.main_proj.weight": torch.randn(D, 3 * D)}
    path = save_foreign(tmp_path / "dspark", {**tensors, **extra}, foreign_config("fp4"))
    with caplog.at_level(logging.WARNING):
        ckpt = Checkpoint.open(path, progress=False)
    assert not ckpt.include_mtp and not [n for n in ckpt.tensor_names if n.startswith("mtp.")]
    assert any("later-variant" in r.getMessage() for r in caplog.records)


def test_unquantized_checkpoint_loads(tmp_path):
    cfg = tiny_config("fp4", "hca,sliding", quantized=False)
    masters = random_master_weights(cfg, seed=4)
    state = load_state(write_checkpoint(tmp_path / "bf16", cfg, masters))
    assert state.keys() == masters.keys() and all(torch.equal(state[k], masters[k]) for k in masters)


def test_pickle_weights_are_refused_without_unpickling(tmp_path):
    marker = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self):
            return (Path.touch, (marker,))

    d = tmp_path / "pt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(foreign_config("fp4")))
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin.*never unpickles"):
        Checkpoint.open(d, progress=False)
    assert not marker.exists()


def test_progress_bar_goes_to_stderr_and_can_be_disabled(tmp_path, capsys):
    path = save_foreign(tmp_path / "p", foreign_tensors("fp4"), foreign_config("fp4"))
    list(Checkpoint.open(path, progress=True).iter_tensors())
    out, err = capsys.readouterr()
    assert "loading weights" in err and "checking scales" in err and out == ""
    list(Checkpoint.open(path, progress=False).iter_tensors())
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def _rss_kb() -> tuple[int, int]:
    """(anonymous, file-backed) resident KiB: mapped shard pages count too."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["RssAnon"].split()[0]), int(fields["RssFile"].split()[0])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_streaming_peak_ram_is_bounded(tmp_path):
    # BF16 experts make a ~200 MB checkpoint of <= 0.5 MB tensors in 16 shards
    cfg = tiny_config("fp4", "hca,sliding,hca", quantized=False, n_routed_experts=32,
                      moe_intermediate_size=512, hidden_size=512)
    path = write_checkpoint(tmp_path / "big", cfg, random_master_weights(cfg, seed=0), num_shards=16)
    sizes = [f.stat().st_size for f in path.glob("*.safetensors")]
    ckpt = Checkpoint.open(path, progress=False)
    bound = max(sizes) + 16 * 2**20  # one mapped shard + slack
    assert sum(sizes) > 5 * bound
    import gc
    gc.collect()
    anon0, file0 = _rss_kb()
    peak_anon = peak_file = 0
    n = 0
    for name, t in ckpt.iter_tensors():
        n += 1
        assert t.numel() > 0 and float(t.float().abs().sum()) > 0  # touch every byte
        del t
        anon, file = _rss_kb()
        peak_anon, peak_file = max(peak_anon, anon - anon0), max(peak_file, file - file0)
    assert n == len(ckpt.specs)
    extra = (peak_anon + peak_file) * 1024
    print(f"streamed {sum(sizes) / 2**20:.0f} MiB in {len(sizes)} shards (largest {max(sizes) / 2**20:.0f} MiB): "
          f"peak extra RSS {extra / 2**20:.1f} MiB")
    assert extra < bound


def test_float32_scales_power_of_two_flag(tmp_path, caplog):
    t8 = foreign_tensors("fp8")
    assert Checkpoint.open(save_foreign(tmp_path / "a", t8, foreign_config("fp8")), progress=False).f32_scales_pow2
    assert Checkpoint.open(save_foreign(tmp_path / "b", foreign_tensors("fp4"), foreign_config("fp4")),
                           progress=False).f32_scales_pow2 is None
    odd = t8["layers.1.attn.wq_b.scale"].clone()
    odd[0, 0] = 0.3  # valid (finite, positive) but not a power of two
    with caplog.at_level(logging.WARNING):
        ckpt = Checkpoint.open(save_foreign(tmp_path / "c", dict(t8, **{"layers.1.attn.wq_b.scale": odd}),
                                            foreign_config("fp8")), progress=False)
    assert ckpt.f32_scales_pow2 is False and "layers.1.attn.wq_b.scale" in caplog.text
    assert same(ckpt.get("layers.1.attn.wq_b.scale"), odd)
