"""Shared helpers of the reference model's unit tests (test_model_units.py, test_model_units_api.py):
a model built from random master weights, and the relative max error."""
from __future__ import annotations

import torch

from dsv4.checkpoint.writer import random_master_weights
from dsv4.config import ModelConfig
from dsv4.model import DeepseekV4ForCausalLM

F64 = torch.float64


def build(cfg: ModelConfig, dtype=F64, numerics="transformers", seed=0) -> DeepseekV4ForCausalLM:
    masters = random_master_weights(cfg, seed)
    model = DeepseekV4ForCausalLM(cfg, dtype, numerics)
    model.load_weights(masters.items())
    model.load_mtp_weights(masters.items())
    model.finalize_weights()
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())
