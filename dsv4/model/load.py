"""`load_model`: validated checkpoint directory -> finalized DeepseekV4ForCausalLM."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from dsv4.model.deepseek_v4 import DeepseekV4ForCausalLM
from dsv4.model.numerics import Numerics

_EXPERT_PREFIX = re.compile(r"experts\.\d+\.w[123]\.")


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               numerics: str | Numerics = "reference", *, include_mtp: bool | None = None,
               progress: bool = False, parallel=None, tp: int = 1, ep: int = 1,
               kernels: str = "auto") -> DeepseekV4ForCausalLM:
    """Validate the checkpoint first (names, shapes, dtypes, scales), then build, load, finalize.

    include_mtp: None loads the MTP block iff the checkpoint has it. Any problem raises (a
    CheckpointError / ValueError naming the file or tensor); no half-built model is returned.

    Several processes: pass `parallel` (a dsv4.distributed.ParallelState), or `tp`/`ep` to create
    one (torch.distributed must be initialised with max(tp, ep) processes). Each rank then reads
    only the routed experts that `model.get_expert_mapping()` lists and keeps its slice of the
    TP-split tensors.

    kernels: "auto" | "torch" | "triton" — "triton" keeps FP8/MXFP4 weights quantised and runs the
    Triton FP8 linear and fused MoE kernels (bf16 on CUDA); "auto" picks it when possible.
    """
    from dsv4.checkpoint.loader import Checkpoint

    if parallel is None and max(tp, ep) > 1:
        from dsv4.distributed.parallel_state import ParallelConfig, init_parallel
        parallel = init_parallel(ParallelConfig(tp, ep), device)
    with Checkpoint.open(path, include_mtp=include_mtp, progress=progress) as ckpt:
        with torch.device(device):
            model = DeepseekV4ForCausalLM(ckpt.config, dtype=dtype, numerics=numerics, parallel=parallel,
                                          kernels=kernels)
        wanted = {prefix for _, prefix, _, _ in model.get_expert_mapping()}

        def needed(name: str) -> bool:  # routed experts: only those this rank holds are read at all
            m = _EXPERT_PREFIX.search(name)
            return m is None or m.group(0) in wanted

        model.load_weights(ckpt.iter_tensors(lambda n: not n.startswith("mtp.") and needed(n)))
        if ckpt.include_mtp:
            model.load_mtp_weights(ckpt.iter_tensors(lambda n: n.startswith("mtp.") and needed(n)))
        model.finalize_weights()
    return model.eval()
