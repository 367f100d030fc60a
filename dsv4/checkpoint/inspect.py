"""`dsv4 inspect`: what a checkpoint (or a config) contains, after full validation.

For a directory it runs the loader's complete validation (names, shapes, dtypes, headers against
file sizes, expert dtype, every block scale) and then summarises; any problem raises CheckpointError.
With `--expected CONFIG.json` it prints the inventory the config implies, without weights.
"""
from __future__ import annotations

from pathlib import Path

from dsv4.checkpoint.loader import Checkpoint
from dsv4.checkpoint.naming import TensorSpec, expected_inventory, inventory_summary, is_mtp_name
from dsv4.config import ModelConfig


def _report(cfg: ModelConfig, specs: dict[str, TensorSpec]) -> dict:
    kinds = [{"layer": s.index, "attention": s.attention, "moe": s.moe} for s in cfg.layers]
    if any(is_mtp_name(n) for n in specs):
        m = cfg.mtp_layer
        kinds.append({"layer": "mtp.0", "attention": m.attention, "moe": m.moe})
    mtp = {n: s for n, s in specs.items() if is_mtp_name(n)}
    return {
        "model": {
            "layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "heads": cfg.num_heads,
            "head_dim": cfg.head_dim, "routed_experts": cfg.n_routed_experts,
            "experts_per_token": cfg.num_experts_per_tok, "expert_intermediate": cfg.moe_intermediate_size,
            "vocab_size": cfg.vocab_size, "mtp_layers": cfg.num_nextn_predict_layers,
        },
        "quantized": cfg.is_quantized,
        "quant_method": cfg.quantization.quant_method if cfg.quantization else None,
        "expert_dtype": cfg.expert_dtype,
        "linear_scale_dtype": cfg.linear_scale_dtype if cfg.is_quantized else None,
        "layer_kinds": kinds,
        "layer_kind_counts": cfg.layer_kind_counts(),
        **inventory_summary(specs),
        "mtp_tensors": len(mtp),
        "mtp_bytes": sum(s.nbytes for s in mtp.values()),
    }


def inspect_checkpoint(path: str | Path, *, include_mtp: bool | None = None, progress: bool = False) -> dict:
    """Validate a checkpoint directory completely and summarise it (CheckpointError on any problem)."""
    with Checkpoint.open(path, include_mtp=include_mtp, progress=progress) as ckpt:
        files = sorted({s.stored.file.name for s in ckpt._sources.values()})
        report = _report(ckpt.config, ckpt.specs)
        report.update(path=str(ckpt.path), layout=ckpt.layout, shards=len(files), valid=True)
        return report


def inspect_expected(config_path: str | Path, *, include_mtp: bool = True) -> dict:
    """The inventory a config.json implies (no weights needed)."""
    cfg = ModelConfig.from_file(config_path)
    report = _report(cfg, expected_inventory(cfg, include_mtp=include_mtp))
    report.update(path=str(config_path), layout="official (expected)")
    return report


def format_report(r: dict) -> str:
    m = r["model"]
    if r["quantized"]:
        experts = "MXFP4" if r["expert_dtype"] == "fp4" else "FP8 128x128 blocks"
        quant = (f"{r['quant_method']} -> deepseek_v4_fp8: routed experts {r['expert_dtype']} ({experts}), "
                 f"linear block scales {'E8M0' if r['linear_scale_dtype'] == 'e8m0' else 'float32'}")
    else:
        quant = "none (unquantized)"
    kinds = " ".join(f"{k['layer']}:{k['attention']}/{k['moe']}" for k in r["layer_kinds"])
    lines = [
        f"{r['path']}  [{r['layout']} layout" + (f", {r['shards']} shards]" if "shards" in r else "]"),
        f"  model        DeepSeek-V4, {m['layers']} layers, hidden {m['hidden_size']}, {m['heads']} heads x "
        f"{m['head_dim']}, {m['routed_experts']} routed experts (top-{m['experts_per_token']}) x "
        f"{m['expert_intermediate']}, vocab {m['vocab_size']}, MTP {m['mtp_layers']}",
        f"  quantization {quant}",
        f"  expert dtype {r['expert_dtype']}",
        "  layers       " + ", ".join(f"{n} {k}" for k, n in r["layer_kind_counts"].items()),
        f"  per layer    {kinds}",
        f"  tensors      {r['tensors']:,}  ({r['bytes']:,} bytes; MTP {r['mtp_tensors']:,} / {r['mtp_bytes']:,})",
    ]
    for dtype, nbytes in r["bytes_by_dtype"].items():
        lines.append(f"    {dtype:<8} {r['tensors_by_dtype'][dtype]:>9,} tensors {nbytes:>20,} bytes")
    if r.get("valid"):
        lines.append("  validation   OK: names, shapes, dtypes, headers and all block scales match config.json")
    return "\n".join(lines)
