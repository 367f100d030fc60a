"""Random weights made in place on the model's device: full-size benchmarks without a checkpoint.

Every parameter and buffer of a built model (sharded or not, kernel mode or not) is filled where it
lives: unquantised tensors by the tiny-checkpoint writer's rules (`init_value`), quantised ones with
random codes and one scale per block sized so that a dequantised row has the std of a master weight
(1/sqrt(in)): FP8 e4m3 codes ~ N(0, 2^2) with scale 2^round(log2(1/(2 sqrt(in)))), MXFP4 bytes
uniform (e2m1 values have std ~2.93) with E8M0 scale 2^round(log2(1/(2.93 sqrt(in)))).
Ranks that fill with the same seed build the same values for the tensors they replicate (parameter
order and shapes agree across ranks), so routing and the mHC mixes agree as in a real checkpoint;
their shards (TP slices, routed experts) come from a second generator seeded by the rank, so they differ.
"""
from __future__ import annotations

import math

import torch

from dsv4.checkpoint.writer import init_value
from dsv4.model.linear import Linear

E2M1_STD = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)


def _block_exponent(in_features: int, code_std: float) -> int:
    return round(math.log2(1.0 / (code_std * math.sqrt(in_features))))


def _fill_quantized(lin: Linear, leaf: str, t: torch.Tensor, g: torch.Generator) -> None:
    k = lin.in_features
    if lin.kernel_format == "mxfp4":
        if leaf == "weight":
            t.view(torch.uint8).copy_(torch.randint(0, 256, t.shape, generator=g, device=g.device,
                                                    dtype=torch.uint8))
        else:  # E8M0 bytes
            t.fill_(127 + _block_exponent(k, E2M1_STD))
    elif leaf == "weight":  # e4m3 codes
        t.copy_((torch.randn(t.shape, generator=g, device=g.device) * 2).to(t.dtype))
    else:  # fp32 block scales
        t.fill_(2.0 ** _block_exponent(k, 2.0))


def _is_shard(layout, module: str, leaf: str) -> bool:
    """A TP slice or a routed expert (the rank's own part), not a replicated tensor."""
    weight = f"{module}.weight" if leaf in ("weight", "scale") else f"{module}.{leaf}" if module else leaf
    return ".experts." in module or layout.cut(weight) is not None


def fill_random_weights(model, seed: int = 0) -> set[str]:
    """Fill every tensor of `model` in place (on its device); returns the names filled."""
    device = next(model.parameters()).device
    layout = getattr(model, "layout", None)
    replicated = torch.Generator(device).manual_seed(seed)
    sharded = torch.Generator(device).manual_seed(seed + 1 + 1009 * (layout.rank if layout is not None else 0))
    quantized = {n: m for n, m in model.named_modules() if isinstance(m, Linear) and m.kernel_format is not None}
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    with torch.no_grad():
        for name, t in targets.items():
            if t.numel() == 0:
                continue
            module, leaf = name.rsplit(".", 1) if "." in name else ("", name)
            g = sharded if layout is not None and _is_shard(layout, module, leaf) else replicated
            if module in quantized:
                _fill_quantized(quantized[module], leaf, t, g)
            else:
                t.copy_(init_value(name, tuple(t.shape), model.config, g).to(t.dtype))
    for m in model.modules():
        if isinstance(m, Linear):
            m.invalidate_cache()
    return set(targets)
