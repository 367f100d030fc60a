"""`dsv4 make-tiny` / `dsv4 inspect`: summaries checked against the raw safetensors headers and the
published totals; every corruption of the loader's list gives a non-zero exit and one error line
naming the tensor or file.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dsv4.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "configs"
ITEMSIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8}


def raw_header(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8:8 + n])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    dirs = {}
    for edt in ("fp4", "fp8"):
        assert main(["make-tiny", str(root / edt), "--expert-dtype", edt, "--seed", "7",
                     "--layers", "hca,sliding,csa,csa"]) == 0
        dirs[edt] = root / edt
    return dirs


def test_inspect_json_matches_raw_headers(tiny, capsys):
    capsys.readouterr()
    assert main(["inspect", str(tiny["fp4"]), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    count, by_dtype = 0, {}
    for f in tiny["fp4"].glob("*.safetensors"):
        _, header = raw_header(f)
        for name, e in header.items():
            if name != "__metadata__":
                count += 1
                by_dtype[e["dtype"]] = by_dtype.get(e["dtype"], 0) + math.prod(e["shape"]) * ITEMSIZE[e["dtype"]]
    assert report["tensors"] == count and report["bytes"] == sum(by_dtype.values())
    assert report["bytes_by_dtype"] == by_dtype
    assert report["expert_dtype"] == "fp4" and report["valid"] and report["layout"] == "official"
    assert [(k["attention"], k["moe"]) for k in report["layer_kinds"]] == [
        ("hca", "hash"), ("sliding", "topk"), ("csa", "topk"), ("csa", "topk"), ("sliding", "topk")]
    assert report["layer_kinds"][-1]["layer"] == "mtp.0" and report["shards"] == 4 + 3


def test_inspect_text(tiny, capsys):
    capsys.readouterr()
    assert main(["inspect", str(tiny["fp8"])]) == 0
    out = capsys.readouterr().out
    assert "expert dtype fp8" in out and "float32" in out and "0:hca/hash" in out and "validation   OK" in out


@pytest.mark.parametrize("name,tensors,nbytes", [("flash", 69187, 159_609_485_896),
                                                  ("pro", 145116, 864_704_792_696),
                                                  ("flash-base", 69187, 292_555_345_480)])
def test_inspect_expected(name, tensors, nbytes, capsys):
    cfg = FIXTURES / f"deepseek-v4-{name}.config.json"
    if not cfg.exists():
        pytest.skip("fixture missing")
    capsys.readouterr()
    assert main(["inspect", "--expected", str(cfg), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["tensors"], r["bytes"]) == (tensors, nbytes)
    assert r["expert_dtype"] == ("fp8" if name == "flash-base" else "fp4")
    assert len(r["layer_kinds"]) == (43 if name != "pro" else 61) + 1


# ---- corruptions ----------------------------------------------------------------------------

def shard_of(d: Path, name: str) -> Path:
    index = json.loads((d / "model.safetensors.index.json").read_text())
    return d / index["weight_map"][name]


def rewrite(d: Path, name: str, new: dict | None = None, drop: bool = False, shard: Path | None = None) -> Path:
    """Rewrite the shard holding `name` (or `shard`) with tensors dropped/replaced/added; fix the index."""
    shard = shard or shard_of(d, name)
    tensors = load_file(str(shard))
    if drop:
        del tensors[name]
    tensors.update(new or {})
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(shard))
    index_path = d / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k in tensors or v != shard.name}
    index["weight_map"].update({k: shard.name for k in tensors})
    index_path.write_text(json.dumps(index))
    return shard


def patch_bytes(d: Path, name: str, offset_in_tensor: int, payload: bytes) -> Path:
    """Overwrite raw bytes of one stored tensor in place (what bit rot or a bad converter does)."""
    shard = shard_of(d, name)
    n, header = raw_header(shard)
    begin = header[name]["data_offsets"][0]
    with open(shard, "r+b") as f:
        f.seek(8 + n + begin + offset_in_tensor)
        f.write(payload)
    return shard


def c_missing(d):
    rewrite(d, "layers.1.attn.wkv.scale", drop=True)
    return d, "layers.1.attn.wkv.scale"  # no file holds it: the message names the checkpoint directory


def c_unexpected(d):
    shard = shard_of(d, "layers.1.attn.wkv.weight")
    rewrite(d, "", {"layers.1.attn.wkv_extra.weight": torch.randn(4, 4)}, shard=shard)
    return shard, "layers.1.attn.wkv_extra.weight"


def c_shape(d):
    return rewrite(d, "layers.2.attn.q_norm.weight", {"layers.2.attn.q_norm.weight": torch.randn(64).bfloat16()}), \
        "layers.2.attn.q_norm.weight"


def c_dtype(d):
    return rewrite(d, "layers.0.attn_norm.weight", {"layers.0.attn_norm.weight": torch.randn(256)}), \
        "layers.0.attn_norm.weight"


def c_truncated(d):
    shard = shard_of(d, "layers.3.attn.wo_b.weight")
    os.truncate(shard, shard.stat().st_size - 1000)
    return shard, None


def c_header_garbage(d):
    shard = shard_of(d, "head.weight")
    with open(shard, "r+b") as f:
        f.seek(9)
        f.write(b"\x00garbage\xff")
    return shard, None


def c_header_length(d):
    shard = shard_of(d, "embed.weight")
    with open(shard, "r+b") as f:
        f.write(struct.pack("<Q", 10 ** 12))
    return shard, None


def c_index_missing_file(d):
    shard = shard_of(d, "layers.2.attn.wkv.weight")
    shard.unlink()
    return shard, None


def c_nan_e8m0_expert_scale(d):
    return patch_bytes(d, "layers.3.ffn.experts.2.w1.scale", 77, b"\xff"), "layers.3.ffn.experts.2.w1.scale"


def c_nan_e8m0_linear_scale(d):
    return patch_bytes(d, "mtp.0.h_proj.scale", 0, b"\xff"), "mtp.0.h_proj.scale"


def c_f32_scale_zero(d):
    return patch_bytes(d, "layers.1.attn.wq_b.scale", 4, struct.pack("<f", 0.0)), "layers.1.attn.wq_b.scale"


def c_f32_scale_inf(d):
    return patch_bytes(d, "layers.2.ffn.experts.1.w2.scale", 0, struct.pack("<f", math.inf)), \
        "layers.2.ffn.experts.1.w2.scale"


def c_f32_scale_negative(d):
    return patch_bytes(d, "layers.0.attn.wo_a.scale", 0, struct.pack("<f", -0.5)), "layers.0.attn.wo_a.scale"


def c_wrong_linear_scale_dtype(d):
    name = "layers.1.attn.wq_a.scale"
    s = load_file(str(shard_of(d, name)))[name]
    f32 = torch.pow(2.0, s.view(torch.uint8).float() - 127)
    return rewrite(d, name, {name: f32}), name


def c_pickle_only(d):
    for f in d.glob("*.safetensors"):
        f.unlink()
    (d / "model.safetensors.index.json").unlink()
    torch.save({"embed.weight": torch.randn(2, 2)}, d / "pytorch_model.bin")
    return d / "pytorch_model.bin", None


def c_bad_config(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["expert_dtype"] = "int4"
    (d / "config.json").write_text(json.dumps(cfg))
    return d / "config.json", "expert_dtype"


def c_mixed_naming(d):
    name = "layers.0.attn.attn_sink"
    t = load_file(str(shard_of(d, name)))[name]
    rewrite(d, name, drop=True)
    return rewrite(d, "", {"model.layers.0.self_attn.sinks": t}, shard=shard_of(d, "layers.0.attn.wkv.weight")), \
        "model.layers.0.self_attn.sinks"


CORRUPTIONS = {  # name -> (base checkpoint, mutate)
    "missing": ("fp4", c_missing), "unexpected": ("fp4", c_unexpected), "shape": ("fp4", c_shape),
    "dtype": ("fp8", c_dtype), "truncated": ("fp4", c_truncated), "header_garbage": ("fp4", c_header_garbage),
    "header_length": ("fp8", c_header_length), "index_missing_file": ("fp4", c_index_missing_file),
    "nan_e8m0_expert": ("fp4", c_nan_e8m0_expert_scale), "nan_e8m0_linear": ("fp4", c_nan_e8m0_linear_scale),
    "f32_scale_zero": ("fp8", c_f32_scale_zero), "f32_scale_inf": ("fp8", c_f32_scale_inf),
    "f32_scale_negative": ("fp8", c_f32_scale_negative),
    "wrong_linear_scale_dtype": ("fp4", c_wrong_linear_scale_dtype), "pickle_only": ("fp4", c_pickle_only),
    "bad_config": ("fp8", c_bad_config), "mixed_naming": ("fp4", c_mixed_naming),
}


def corrupt(tiny, tmp_path, kind):
    base, mutate = CORRUPTIONS[kind]
    d = tmp_path / kind
    shutil.copytree(tiny[base], d)
    path, tensor = mutate(d)
    return d, path.name, tensor


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corruption_gives_error_naming_file_and_tensor(tiny, tmp_path, capsys, kind):
    d, fname, tensor = corrupt(tiny, tmp_path, kind)
    capsys.readouterr()
    rc = main(["inspect", str(d)])
    out, err = capsys.readouterr()
    assert rc != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dsv4 inspect: error: "), err
    assert fname in lines[0], lines[0]
    if tensor:
        assert tensor in lines[0], lines[0]
    if kind == "wrong_linear_scale_dtype":
        assert "linear block scale" in lines[0] and "F8_E8M0" in lines[0]
    if kind == "missing":
        assert "missing" in lines[0]


def test_corruption_via_subprocess(tiny, tmp_path):
    d, fname, tensor = corrupt(tiny, tmp_path, "nan_e8m0_expert")
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "dsv4", "inspect", str(d)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert proc.returncode != 0 and proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert tensor in proc.stderr and fname in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cli_usage_errors(capsys, tmp_path):
    assert main([]) != 0
    assert main(["inspect"]) == 1
    assert "either a checkpoint DIR or --expected" in capsys.readouterr().err
    assert main(["make-tiny", str(tmp_path / "x"), "--layers", "sliding,mla"]) == 1
    assert "--layers" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "nope")]) == 1
    assert "nope" in capsys.readouterr().err
