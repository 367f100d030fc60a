"""dsv4: exact and fast inference for DeepSeek-V4 checkpoints."""
from __future__ import annotations

__version__ = "0.1.0"


def load_model(path, device="cpu", dtype=None, numerics="reference", **kwargs):
    """Load a checkpoint directory as a ready `DeepseekV4ForCausalLM` (see dsv4.model.load)."""
    import torch

    from dsv4.model.load import load_model as _load_model
    return _load_model(path, device=device, dtype=torch.float32 if dtype is None else dtype,
                       numerics=numerics, **kwargs)


def __getattr__(name):  # lazy: `import dsv4` stays cheap; the engine loads on first use
    if name == "LLM":
        from dsv4.engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from dsv4.engine.sampling_params import SamplingParams
        return SamplingParams
    if name == "StructuredOutput":
        from dsv4.engine.structured import StructuredOutput
        return StructuredOutput
    raise AttributeError(f"module 'dsv4' has no attribute {name!r}")


__all__ = ["load_model", "LLM", "SamplingParams", "StructuredOutput", "__version__"]
