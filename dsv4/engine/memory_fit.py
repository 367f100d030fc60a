"""Building what must fit in the GPU's memory (the weights, the cache) with an out-of-memory error turned into a
ValueError that says how much was free and what to do, instead of torch's allocator dump."""
from __future__ import annotations

from pathlib import Path

import torch


def load_fitting(path: Path, device, **kwargs):
    """`dsv4.load_model`, with the GPU running out of memory reported as a ValueError that says what to do."""
    from .. import load_model
    model, oom = fits(lambda: load_model(path, device=device, **kwargs))
    if oom is None:
        return model
    raise ValueError(f"{path}: the weights do not fit in the GPU's memory{free_memory(torch.device(device))}: "
                     f"`dsv4 plan {path} --gpus N` says how many GPUs they need (then --tp/--ep). {oom}")


def fits(make):
    """(make(), None), or (None, the first line of torch's out-of-memory error) once the exception, and with it
    whatever `make` had allocated, is gone (so the caller's own error does not hold that memory)."""
    try:
        return make(), None
    except torch.OutOfMemoryError as e:
        first = str(e).split("\n")[0]
    return None, first


def free_memory(device: torch.device) -> str:
    """" (F of T GiB free now)" on a GPU (for out-of-memory errors), else ""."""
    if device.type != "cuda":
        return ""
    torch.cuda.empty_cache()  # (what the failed allocation's caller had taken goes back first)
    free, total = torch.cuda.mem_get_info(device)
    return f" ({free / 2**30:.1f} of {total / 2**30:.1f} GiB free now)"
