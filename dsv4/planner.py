"""Memory planner: do a config's weights and decode cache fit on N GPUs, and how many tokens of cache
remain? (`dsv4 plan`.)

Per GPU (rank r of the layout `--tp/--ep`, dsv4.distributed.sharding; all ranks hold equal slices):

    weights   every tensor of the expected checkpoint inventory (dsv4.checkpoint.naming), cut to the
              rank's slice: TP-split attention/shared expert/vocabulary, its EP rank's routed experts
              only. "stored" = checkpoint bytes (FP8 linears, MXFP4/FP8 experts, scales: what GPU
              kernels keep); "dequantized" = what the CPU reference model holds (model dtype).
    budget    gpu_memory x utilization; the rest is left to the CUDA context, NCCL buffers,
              activations (like vLLM's gpu_memory_utilization) and CUDA graphs (Flash: the prefill
              pieces ≈ 1.3 GiB, `--prefill-graph-tokens`; the decode graphs' pool 28-92 MiB).
    fixed     per sequence: the window rings (all layers + MTP) and the compressors' raw rows, times
              max_num_seqs (sizes from the engine's own pools, dsv4.engine.paged_state).
    tokens    (budget - weights - fixed) / cache bytes per token of context
              (dsv4.engine.paged_state.cache_bytes_per_token: compressed entries + indexer keys).

The decode cache is not split across ranks (one K=V head, compressed entries shared by all heads),
so every GPU holds the cache of every sequence: "tokens" is also the whole system's capacity.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from dsv4.checkpoint.naming import TensorSpec, expected_inventory
from dsv4.config import ModelConfig

MiB, GB = 1 << 20, 10 ** 9
GPU_MEMORY = {"h200": 143771 * MiB, "h100": 81559 * MiB, "b200": 183359 * MiB}  # as nvidia-smi reports
_SIZE = re.compile(r"^\s*([0-9.]+)\s*(gib|gb|mib|mb)?\s*$", re.IGNORECASE)
_UNITS = {None: GB, "gb": GB, "gib": 1 << 30, "mb": 10 ** 6, "mib": MiB}
_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
           "float32": torch.float32}


@dataclass
class Plan:
    model: str
    gpus: int
    tp: int
    ep: int
    gpu_memory: int                 # bytes per GPU
    utilization: float
    weight_format: str
    kv_dtype: str
    weights: int                    # bytes on the fullest GPU
    weights_by_part: dict[str, int]
    budget: int                     # gpu_memory * utilization
    max_num_seqs: int
    fixed_per_sequence: int
    cache_bytes_per_token: float
    cache_tokens: int               # tokens of context that fit (0 when nothing fits)
    fits: bool
    reason: str
    kept_states: int = 0            # states held beside the sequences' (retained entries, prefix snapshots)


def parse_memory(text: str) -> int:
    """'h200', '141GB', '139.8GiB', '143771MiB' -> bytes (a bare number is GB)."""
    key = text.strip().lower()
    if key in GPU_MEMORY:
        return GPU_MEMORY[key]
    m = _SIZE.match(key)
    if not m:
        raise ValueError(f"--gpu-memory {text!r}: expected {', '.join(GPU_MEMORY)} or a size like 141GB / 139GiB")
    return int(float(m.group(1)) * _UNITS[m.group(2) and m.group(2).lower()])


def load_config(source: str | Path) -> ModelConfig:
    """A config.json file or a checkpoint directory holding one."""
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"{source}: no such config.json or checkpoint directory")
    return ModelConfig.from_file(path)


def _part(name: str) -> str:
    if ".ffn.experts." in name:
        return "routed experts"
    if name.startswith(("embed.", "head.")):
        return "embed+head"
    if ".attn." in name:
        return "attention"
    if ".shared_experts." in name:
        return "shared experts"
    return "other"


def rank_weight_bytes(config: ModelConfig, tp: int, ep: int, rank: int, *, include_mtp: bool = True,
                      weight_format: str = "stored", dtype: torch.dtype = torch.bfloat16,
                      inventories: tuple[dict, dict] | None = None) -> dict[str, int]:
    """Bytes of the weights rank `rank` holds, by part. `inventories`: (stored, logical) inventories
    of the config, if already built."""
    from dsv4.distributed.sharding import BLOCK, Layout

    if weight_format not in ("stored", "dequantized"):
        raise ValueError(f"weight_format={weight_format!r}; allowed: stored, dequantized")
    layout = Layout(config, tp, ep, rank)
    inventory, logical = inventories or (expected_inventory(config, include_mtp=include_mtp),
                                         expected_inventory(config, include_mtp=include_mtp, quantized=False))
    elem = torch.empty(0, dtype=dtype).element_size()
    out: dict[str, int] = {}
    for name, spec in inventory.items():
        if not layout.owns(name):
            continue
        if name.endswith(".scale"):
            if weight_format == "dequantized":
                continue
            weight = name[: -len(".scale")] + ".weight"
            cut = layout.cut(weight)
            shape = list(spec.shape)
            if cut is not None:  # FP8 tiles: the scale rows/columns of the kept weight slice
                shape[cut.dim] = -(-(cut.start + cut.length) // BLOCK) - cut.start // BLOCK
            nbytes = TensorSpec(tuple(shape), spec.dtype).nbytes
        elif weight_format == "dequantized" and spec.dtype not in ("F32", "I64"):
            nbytes = math.prod(layout.local_shape(name, logical[name].shape)) * elem
        else:
            stored = list(layout.local_shape(name, logical[name].shape))
            if spec.shape != logical[name].shape:  # packed MXFP4 experts: two values per byte
                stored[-1] = spec.shape[-1]
            nbytes = TensorSpec(tuple(stored), spec.dtype).nbytes
        out[_part(name)] = out.get(_part(name), 0) + nbytes
    return out


def fixed_bytes_per_sequence(config: ModelConfig, kv_dtype: str, dtype: torch.dtype) -> int:
    """Window rings + compressor rows of one sequence, as the engine's pools lay them out."""
    from dsv4.engine.block_manager import required_kinds
    from dsv4.engine.cache import CacheConfig, HybridCache

    kinds = required_kinds(config.compress_ratios)
    cache = HybridCache(config, CacheConfig(num_pages={k: 1 for k in kinds}, kv_dtype=kv_dtype),
                        dtype=dtype, device="meta")
    return sum(cache.pools.fixed_bytes_per_sequence().values())


def plan(config: ModelConfig, *, gpus: int, gpu_memory: int, tp: int | None = None, ep: int | None = None,
         utilization: float = 0.9, weight_format: str = "stored", kv_dtype: str = "auto",
         dtype: torch.dtype = torch.bfloat16, max_num_seqs: int = 64, include_mtp: bool = True,
         model: str = "", kept_states: int = 0) -> Plan:
    """Fit check for `gpus` GPUs of `gpu_memory` bytes; tp/ep default to the GPU count. `kept_states`: decode states
    held beside the sequences' (the engine's retained entries and prefix snapshots), each with the fixed state of a
    sequence."""
    from dsv4.distributed.parallel_state import ParallelConfig
    from dsv4.engine.paged_state import cache_bytes_per_token

    tp, ep = tp or gpus, ep or gpus
    world = ParallelConfig(tp, ep).world_size
    if world != gpus:
        raise ValueError(f"--tp {tp} --ep {ep} runs on {world} GPUs, not --gpus {gpus}")
    if not 0 < utilization <= 1:
        raise ValueError(f"--utilization {utilization}: must be in (0, 1]")
    if max_num_seqs < 1:
        raise ValueError(f"--max-num-seqs {max_num_seqs}: must be >= 1")
    if kept_states < 0:
        raise ValueError(f"--kept-states {kept_states}: must be >= 0")
    inventories = (expected_inventory(config, include_mtp=include_mtp),
                   expected_inventory(config, include_mtp=include_mtp, quantized=False))
    # every rank holds equal-sized slices (the layout only allows even splits): rank 0 stands for all
    by_part = rank_weight_bytes(config, tp, ep, 0, include_mtp=include_mtp, weight_format=weight_format,
                                dtype=dtype, inventories=inventories)
    weights = sum(by_part.values())
    budget = int(gpu_memory * utilization)
    per_token = sum(cache_bytes_per_token(config, kv_dtype, dtype).values())
    fixed = fixed_bytes_per_sequence(config, kv_dtype, dtype)
    free = budget - weights - (max_num_seqs + kept_states) * fixed
    tokens = max(0, int(free // per_token)) if per_token else 0
    if weights > budget:
        fits, reason = False, f"weights need {weights / GB:.1f} GB per GPU, budget is {budget / GB:.1f} GB"
    elif free <= 0:
        fits, reason = False, f"no room for the fixed state of {max_num_seqs} sequences and {kept_states} kept"
    else:
        fits, reason = True, f"{tokens:,} tokens of cache ({tokens // max_num_seqs:,} per sequence at " \
                             f"{max_num_seqs} sequences)"
    return Plan(model, gpus, tp, ep, gpu_memory, utilization, weight_format, kv_dtype, weights, by_part, budget,
                max_num_seqs, fixed, per_token, tokens, fits, reason, kept_states)


def format_plan(p: Plan) -> str:
    gb = lambda b: f"{b / GB:,.1f} GB"  # noqa: E731
    parts = ", ".join(f"{k} {gb(v)}" for k, v in sorted(p.weights_by_part.items(), key=lambda kv: -kv[1]))
    return "\n".join([
        f"{p.model or 'model'} on {p.gpus} GPU(s) of {gb(p.gpu_memory)} ({p.gpu_memory / (1 << 30):,.1f} GiB), "
        f"tp={p.tp} ep={p.ep}",
        f"weights per GPU ({p.weight_format}): {gb(p.weights)}  [{parts}]",
        f"budget per GPU: {gb(p.budget)} ({p.utilization:.0%} of the GPU)",
        f"fixed state per sequence: {p.fixed_per_sequence / MiB:,.1f} MiB x ({p.max_num_seqs} sequences + "
        f"{p.kept_states} kept) = {gb(p.fixed_per_sequence * (p.max_num_seqs + p.kept_states))}",
        f"cache per token of context (kv_dtype={p.kv_dtype}): {p.cache_bytes_per_token:,.2f} B",
        f"fits: {'yes' if p.fits else 'NO'}: {p.reason}",
        *([f"serve with: --max-num-seqs {p.max_num_seqs} --cache-tokens {p.cache_tokens}"
           + (" --kv-dtype auto" if p.kv_dtype == "auto" else "")] if p.fits else []),
    ])


# ---- `dsv4 plan` ---------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="config.json or checkpoint directory")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    p.add_argument("--gpu-memory", default="h200",
                   help=f"memory per GPU: {', '.join(GPU_MEMORY)} or a size like 141GB / 139GiB (default h200)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: --gpus)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel size (default: --gpus)")
    p.add_argument("--utilization", type=float, default=0.9, help="fraction of each GPU to use (default 0.9)")
    p.add_argument("--weights", choices=("stored", "dequantized"), default="stored",
                   help="stored: checkpoint formats (GPU kernels); dequantized: model dtype (CPU reference)")
    p.add_argument("--kv-dtype", choices=("auto", "fp8"), default="fp8",
                   help="decode cache storage: fp8 = FP8 KV + FP4 indexer keys (default, as serve's on a GPU); "
                        "auto = model dtype")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16", help="model dtype (default bf16)")
    p.add_argument("--max-num-seqs", type=int, default=64, help="sequences held at once (default 64)")
    p.add_argument("--kept-states", type=int, default=48,
                   help="states kept beside the sequences': serve's --retain-finished + --prefix-snapshots "
                        "(default 48, serve's defaults: 32 + 16)")
    p.add_argument("--no-mtp", action="store_true", help="leave out the MTP block")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    name = Path(args.config).name.removesuffix(".json").removesuffix(".config")
    result = plan(config, gpus=args.gpus, gpu_memory=parse_memory(args.gpu_memory), tp=args.tp, ep=args.ep,
                  utilization=args.utilization, weight_format=args.weights, kv_dtype=args.kv_dtype,
                  dtype=_DTYPES[args.dtype], max_num_seqs=args.max_num_seqs, include_mtp=not args.no_mtp,
                  model=name, kept_states=args.kept_states)
    print(json.dumps(asdict(result), indent=2) if args.json else format_plan(result))
    return 0
