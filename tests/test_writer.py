"""Writer: the written files are exactly the expected inventory, and dequantize to the masters within
the quantization error. References: float64 decoders of e4m3 / e2m1 / E8M0 written from the bit
layouts in checkpoint_format.md §5–§6 (not the dsv4 codecs), and transformers 5.23 as an
independent reader of the official format.
"""
import json
import math

import pytest
import torch
from safetensors import safe_open

from dsv4.checkpoint.loader import Checkpoint
from dsv4.checkpoint.naming import expected_inventory, is_routed_expert_name
from dsv4.checkpoint.writer import (
    parse_layers, quantize_masters, random_master_weights, tiny_config, write_checkpoint,
)
from dsv4.config import ModelConfig

E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]  # §6 table


def e4m3_f64(t: torch.Tensor) -> torch.Tensor:
    """OCP e4m3fn from its bits: sign, 4 exponent bits (bias 7), 3 mantissa bits (§5)."""
    b = t.view(torch.uint8).to(torch.int64)
    sign = torch.where(b >> 7 == 1, -1.0, 1.0).double()
    e, m = (b >> 3) & 15, (b & 7).double()
    normal = (1 + m / 8) * torch.pow(2.0, (e - 7).double())
    sub = (m / 8) * 2.0 ** -6
    v = sign * torch.where(e == 0, sub, normal)
    return torch.where((e == 15) & (b & 7 == 7), torch.tensor(float("nan"), dtype=torch.float64), v)


def e8m0_f64(t: torch.Tensor) -> torch.Tensor:
    b = t.view(torch.uint8).double()
    return torch.where(b == 255, float("nan"), torch.pow(2.0, b - 127))


def e2m1_f64(packed: torch.Tensor) -> torch.Tensor:
    b = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack((b & 15, b >> 4), dim=-1).flatten(-2)  # low nibble = even element
    return torch.tensor(E2M1, dtype=torch.float64)[codes]


def dequant_fp8_f64(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    sf = e8m0_f64(s) if s.dtype == torch.float8_e8m0fnu else s.double()
    return e4m3_f64(w) * sf.repeat_interleave(128, 0).repeat_interleave(128, 1)[: w.shape[0], : w.shape[1]]


def dequant_fp4_f64(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return e2m1_f64(w) * e8m0_f64(s).repeat_interleave(32, 1)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (float8 tensors compared as bytes)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1 else torch.equal(a, b)


def read_dir(path) -> tuple[dict, dict]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    tensors, where = {}, {}
    for fname in sorted(set(index["weight_map"].values())):
        with safe_open(str(path / fname), framework="pt") as f:
            for k in f.keys():
                tensors[k] = f.get_tensor(k)
                where[k] = fname
    return tensors, where


@pytest.fixture(scope="module", params=["fp4", "fp8"])
def written(request, tmp_path_factory):
    cfg = tiny_config(request.param)
    masters = random_master_weights(cfg, seed=3)
    out = write_checkpoint(tmp_path_factory.mktemp(f"w{request.param}"), cfg, masters)
    return cfg, masters, out


def test_files_are_exactly_the_inventory(written):
    cfg, masters, out = written
    tensors, where = read_dir(out)
    inv = expected_inventory(cfg)
    assert set(tensors) == set(inv)
    to_st = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3",
             torch.float8_e8m0fnu: "F8_E8M0", torch.int8: "I8", torch.int64: "I64"}
    for name, t in tensors.items():
        assert (tuple(t.shape), to_st[t.dtype]) == (inv[name].shape, inv[name].dtype), name
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    shards = sorted(set(where.values()))
    assert len(shards) == cfg.num_layers + 3  # released placement: embed | layers | head... | mtp
    assert where["embed.weight"] == shards[0] and where["mtp.0.e_proj.weight"] == shards[-1]
    assert len({where[k] for k in tensors if k.startswith("layers.2.")}) == 1
    assert ModelConfig.from_file(out / "config.json") == cfg
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (0, 1)
    # the tiny config's promises: three attention kinds, a hash layer, whole 128 tiles, >= 16 indexer heads
    assert {s.attention for s in cfg.layers} == {"sliding", "csa", "hca"}
    assert cfg.layers[0].moe == "hash" and cfg.index_n_heads >= 16 and cfg.index_topk == 8
    for name, spec in inv.items():
        if name.endswith(".weight") and name[:-7] + ".scale" in inv and spec.dtype == "F8_E4M3":
            assert spec.shape[0] % 128 == 0 and spec.shape[1] % 128 == 0, name


def test_dequantized_weights_within_quantization_error(written):
    cfg, masters, out = written
    tensors, _ = read_dir(out)
    n_fp8 = n_fp4 = 0
    for name, master in masters.items():
        m = master.double()
        module = name[:-7] if name.endswith(".weight") else None
        if module is None or f"{module}.scale" not in tensors:
            assert tensors[name].dtype == master.dtype and torch.equal(tensors[name], master), name
            continue
        w, s = tensors[name], tensors[f"{module}.scale"]
        if w.dtype == torch.int8:  # MXFP4: per row, per 32 columns
            n_fp4 += 1
            deq = dequant_fp4_f64(w, s)
            scale = e8m0_f64(s).repeat_interleave(32, 1)
            amax = m.abs().view(m.shape[0], -1, 32).amax(-1)
            ratio = amax / e8m0_f64(s)
            assert bool(((ratio > 3) & (ratio <= 6)).all()), f"{name}: scale not the smallest pow2 >= amax/6"
            v = (m / scale).abs()  # half the e2m1 grid spacing at v
            half = torch.where(v < 2, 0.25, torch.where(v < 4, 0.5, 1.0)) * scale
        else:  # FP8 128x128 tiles
            n_fp8 += 1
            assert s.dtype == (torch.float8_e8m0fnu if (cfg.expert_dtype == "fp4") else torch.float32)
            sf = e8m0_f64(s) if s.dtype == torch.float8_e8m0fnu else s.double()
            assert bool((torch.log2(sf) == torch.round(torch.log2(sf))).all()), f"{name}: scale not a power of two"
            deq = dequant_fp8_f64(w, s)
            scale = sf.repeat_interleave(128, 0).repeat_interleave(128, 1)
            tiles = m.abs().view(m.shape[0] // 128, 128, m.shape[1] // 128, 128).amax((1, 3))
            ratio = tiles / sf
            assert bool(((ratio > 224) & (ratio <= 448)).all()), f"{name}: scale not the smallest pow2 >= amax/448"
            v = (m / scale).abs()
            ulp = torch.where(v < 2.0 ** -6, 2.0 ** -9, torch.pow(2.0, torch.floor(torch.log2(v.clamp_min(1e-30))) - 3))
            half = ulp / 2 * scale
        err = (deq - m).abs()
        assert bool((err <= half * (1 + 1e-12)).all()), f"{name}: max excess {float((err - half).max())}"
        assert float(err.max()) > 0  # really quantized, not stored losslessly
    n_exp = 3 * cfg.n_routed_experts * (cfg.num_layers + 1)
    assert (n_fp4, n_fp8) == ((n_exp, 44) if cfg.expert_dtype == "fp4" else (0, 44 + n_exp))


def test_random_masters_are_sensible():
    cfg = tiny_config("fp4", "csa,hca", num_hash_layers=2)
    m = random_master_weights(cfg, seed=5)
    assert m.keys() == expected_inventory(cfg, quantized=False).keys()
    name = "layers.1.attn.wq_b.weight"
    assert torch.equal(m[name], random_master_weights(cfg, seed=5)[name])
    assert not torch.equal(m[name], random_master_weights(cfg, seed=6)[name])
    for layer in (0, 1):
        t = m[f"layers.{layer}.ffn.gate.tid2eid"]
        assert t.dtype == torch.int64 and t.shape == (cfg.vocab_size, cfg.num_experts_per_tok)
        assert int(t.min()) >= 0 and int(t.max()) < cfg.n_routed_experts
        assert bool((t.sort(dim=1).values.diff(dim=1) != 0).all())  # distinct per row
    w = m["layers.0.ffn.experts.3.w2.weight"].double()
    assert abs(float(w.std()) * math.sqrt(w.shape[1]) - 1) < 0.05  # std 1/sqrt(fan_in)
    assert abs(float(m["layers.0.attn_norm.weight"].double().mean()) - 1) < 0.02
    assert "layers.1.ffn.gate.bias" not in m and float(m["mtp.0.ffn.gate.bias"].abs().max()) < 0.1
    assert m["layers.0.hc_attn_fn"].dtype == torch.float32 and m["embed.weight"].dtype == torch.bfloat16


def test_shard_options_and_bad_masters(tmp_path):
    cfg = tiny_config("fp4", "sliding,hca")
    masters = random_master_weights(cfg, seed=1)
    ref = dict(Checkpoint.open(write_checkpoint(tmp_path / "a", cfg, masters), progress=False).iter_tensors())
    for kw, n in (({"num_shards": 2}, 2), ({"num_shards": 5}, 5), ({"max_shard_bytes": 400_000}, None)):
        out = write_checkpoint(tmp_path / str(kw), cfg, masters, **kw)
        files = sorted(out.glob("*.safetensors"))
        if n:
            assert len(files) == n
        else:
            assert len(files) >= 3 and all(f.stat().st_size < 400_000 + 300_000 for f in files)
        got = dict(Checkpoint.open(out, progress=False).iter_tensors())
        assert got.keys() == ref.keys() and all(same(got[k], ref[k]) for k in ref)
    bad = dict(masters)
    del bad["layers.1.attn.wo_a.weight"]
    with pytest.raises(ValueError, match="layers.1.attn.wo_a.weight"):
        quantize_masters(cfg, bad)
    bad = dict(masters, **{"layers.1.attn.wo_a.weight": torch.randn(3, 3)})
    with pytest.raises(ValueError, match="layers.1.attn.wo_a.weight"):
        quantize_masters(cfg, bad)
    with pytest.raises(ValueError, match="--layers"):
        parse_layers("sliding,mla")


def test_transformers_reads_our_checkpoints(written, tmp_path):
    """transformers' own loader (name conversion + FP8/MXFP4 dequantization) sees our values exactly,
    and its module tree, saved as a transformers-layout checkpoint, loads back through our loader."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    cfg, _, out = written
    qc = transformers.FineGrainedFP8Config(dequantize=True, expert_dtype=cfg.expert_dtype, scale_fmt="ue8m0")
    model, info = transformers.DeepseekV4ForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, quantization_config=qc, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    sd = model.state_dict()
    tensors, _ = read_dir(out)
    E, I = cfg.n_routed_experts, cfg.moe_intermediate_size
    for layer in range(cfg.num_layers):
        p, q = f"layers.{layer}.", f"model.layers.{layer}."
        for ours, theirs in (("attn.wq_a", "self_attn.q_a_proj"), ("attn.wo_a", "self_attn.o_a_proj"),
                             ("ffn.shared_experts.w3", "mlp.shared_experts.up_proj")):
            expect = dequant_fp8_f64(tensors[p + ours + ".weight"], tensors[p + ours + ".scale"])
            assert torch.equal(sd[q + theirs + ".weight"].double(), expect), ours
        deq = dequant_fp4_f64 if cfg.expert_dtype == "fp4" else dequant_fp8_f64
        gate_up, down = sd[q + "mlp.experts.gate_up_proj"].double(), sd[q + "mlp.experts.down_proj"].double()
        for e in range(E):
            x = lambda w: deq(tensors[f"{p}ffn.experts.{e}.{w}.weight"], tensors[f"{p}ffn.experts.{e}.{w}.scale"])
            assert torch.equal(gate_up[e, :I], x("w1")) and torch.equal(gate_up[e, I:], x("w3"))
            assert torch.equal(down[e], x("w2"))

    # transformers-layout, unquantized: its own state_dict names; fp32 dequantized weights -> bf16 (exact)
    f32 = ("sinks", "position_bias", "_hc.fn", "_hc.base", "_hc.scale", "hc_head.hc_fn", "hc_head.hc_base",
           "hc_head.hc_scale", "e_score_correction_bias")
    state = {k: (v if v.dtype == torch.int64 or k.endswith(f32) else v.to(torch.bfloat16)).contiguous()
             for k, v in sd.items()}
    from safetensors.torch import save_file
    tf_dir = tmp_path / "tf"
    tf_dir.mkdir()
    keys = sorted(state)
    save_file({k: state[k] for k in keys[::2]}, str(tf_dir / "a.safetensors"))
    save_file({k: state[k] for k in keys[1::2]}, str(tf_dir / "b.safetensors"))
    d = cfg.to_dict()
    del d["quantization_config"]
    (tf_dir / "config.json").write_text(json.dumps(d))
    ckpt = Checkpoint.open(tf_dir, include_mtp=None, progress=False)
    assert ckpt.layout == "transformers" and not ckpt.include_mtp
    got = dict(ckpt.iter_tensors())
    assert got.keys() == expected_inventory(ModelConfig.from_dict(d), include_mtp=False).keys()
    for name, t in got.items():
        module = name[:-7] if name.endswith(".weight") else None
        if module and f"{module}.scale" in tensors:
            fp4 = is_routed_expert_name(name) and cfg.expert_dtype == "fp4"
            expect = (dequant_fp4_f64 if fp4 else dequant_fp8_f64)(tensors[name], tensors[f"{module}.scale"])
            assert t.dtype == torch.bfloat16 and torch.equal(t.double(), expect), name
        else:
            assert torch.equal(t, tensors[name]), name
