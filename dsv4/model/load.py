"""`load_model`: validated checkpoint directory -> finalized DeepseekV4ForCausalLM."""
from __future__ import annotations

from pathlib import Path

import torch

from dsv4.model.deepseek_v4 import DeepseekV4ForCausalLM
from dsv4.model.numerics import Numerics


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               numerics: str | Numerics = "reference", *, include_mtp: bool | None = None,
               progress: bool = False) -> DeepseekV4ForCausalLM:
    """Validate the checkpoint first (names, shapes, dtypes, scales), then build, load, finalize.

    include_mtp: None loads the MTP block iff the checkpoint has it. Any problem raises (a
    CheckpointError / ValueError naming the file or tensor); no half-built model is returned.
    """
    from dsv4.checkpoint.loader import Checkpoint

    with Checkpoint.open(path, include_mtp=include_mtp, progress=progress) as ckpt:
        with torch.device(device):
            model = DeepseekV4ForCausalLM(ckpt.config, dtype=dtype, numerics=numerics)
        model.load_weights(ckpt.iter_tensors(lambda n: not n.startswith("mtp.")))
        if ckpt.include_mtp:
            model.load_mtp_weights(ckpt.iter_tensors("mtp."))
        model.finalize_weights()
    return model.eval()
