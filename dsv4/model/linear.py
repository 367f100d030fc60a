"""Linear layers and weight dequantisation.

A `Linear` keeps its weight dequantised in the model dtype (`[out, in]`, official name `X.weight`).
Whether its *input* is FP8-quantised depends on what the checkpoint stores for it (FP8/FP4 weights
imply FP8 activations in the reference GEMMs) and on the numerics switch, never on how the weight was
delivered: a model loaded from unquantised master weights computes the same as one loaded from the
quantised checkpoint of those masters.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsv4.model.numerics import Numerics, acc_dtype, quantize_activation

# What the checkpoint may store for a weight (besides an unquantised float tensor).
PLAIN = "plain"    # bf16/f32 only
FP8 = "fp8"        # F8_E4M3 + 128x128 block scale
EXPERT = "expert"  # MXFP4 (I8 packed + per-32 E8M0 scale) or FP8 block (Flash-Base)


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, numerics: Numerics,
                 weight_format: str = PLAIN, quantize_input: bool | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_format = weight_format
        if quantize_input is None:  # FP8/FP4 weights run as FP8 x FP8 GEMMs in the reference
            quantize_input = weight_format != PLAIN
        self.quantize_input = quantize_input and numerics.quantize_activations
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        self._acc_weight: torch.Tensor | None = None  # weight in the accumulation dtype, built lazily

    def acc_weight(self) -> torch.Tensor:
        acc = acc_dtype(self.weight.dtype)
        if acc == self.weight.dtype:
            return self.weight
        w = self._acc_weight
        if w is None or w.device != self.weight.device:
            w = self._acc_weight = self.weight.detach().to(acc)
        return w

    def invalidate_cache(self) -> None:
        self._acc_weight = None

    def _apply(self, fn, recurse=True):  # .to()/.cuda() change the weight: drop the cached copy
        self._acc_weight = None
        return super()._apply(fn, recurse)

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        """The GEMM input: FP8-quantised when this linear quantises activations (compute it once and
        pass `input_ready=True` when several linears share an input)."""
        return quantize_activation(x) if self.quantize_input else x

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None,
                input_ready: bool = False) -> torch.Tensor:
        """y = W x accumulated in acc_dtype(x.dtype); result in out_dtype or x.dtype."""
        if not input_ready:
            x = self.prepare_input(x)
        acc = acc_dtype(x.dtype)
        y = F.linear(x.to(acc), self.acc_weight())
        return y.to(out_dtype or x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, format={self.weight_format}, " \
               f"quantize_input={self.quantize_input}"


def dequantize_weight(name: str, weight: torch.Tensor, scale: torch.Tensor, weight_format: str,
                      dtype: torch.dtype) -> torch.Tensor:
    """Dequantise a stored (weight, scale) pair: FP8 block or MXFP4 (experts only)."""
    if weight.dtype == torch.float8_e4m3fn and weight_format in (FP8, EXPERT):
        from dsv4.quant.fp8 import dequantize_fp8_block
        return dequantize_fp8_block(weight, scale, dtype=dtype)
    if weight.dtype in (torch.int8, torch.uint8) and weight_format == EXPERT:
        from dsv4.quant.mxfp4 import dequantize_mxfp4
        return dequantize_mxfp4(weight, scale, dtype=dtype)
    raise ValueError(f"{name}: stored dtype {weight.dtype} with a .scale is not a valid format for "
                     f"this weight (expected {'F8_E4M3 or packed MXFP4 I8' if weight_format == EXPERT else 'F8_E4M3'})")
