"""Linear layers and weight dequantisation.

A `Linear` keeps its weight dequantised in the model dtype (`[out, in]`, official name `X.weight`).
Whether its *input* is FP8-quantised depends on what the checkpoint stores for it (FP8/FP4 weights
imply FP8 activations in the reference GEMMs) and on the numerics switch, never on how the weight was
delivered: a model loaded from unquantised master weights computes the same as one loaded from the
quantised checkpoint of those masters.

Kernel mode (a model built with `kernels="triton"`, see `quantized_weights`): every linear that
quantises its input keeps its weight as stored — `weight` e4m3 [out, in] + `scale` fp32 128x128
blocks, or for MXFP4 experts `weight` int8 [out, in/2] + `scale` E8M0 bytes [out, in/32] — and runs
`dsv4.kernels.fp8_linear` (activation quantisation inside the kernel). MXFP4 experts are only
storage here: `MoE.pack_experts` moves them into the fused MoE kernel's layout.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from dsv4.model.numerics import Numerics, acc_dtype, quantize_activation

# What the checkpoint may store for a weight (besides an unquantised float tensor).
PLAIN = "plain"    # bf16/f32 only
FP8 = "fp8"        # F8_E4M3 + 128x128 block scale
EXPERT = "expert"  # MXFP4 (I8 packed + per-32 E8M0 scale) or FP8 block (Flash-Base)

# Set while a kernels="triton" model is built: the checkpoint's expert dtype ("fp4" | "fp8").
_KEEP_QUANTIZED: ContextVar[str | None] = ContextVar("dsv4_keep_quantized", default=None)


_HAS_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype")  # torch.mm(..., out_dtype=) (CUDA)


def bf16_gemm_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `bf16_gemm_fp32` runs for these operands (CUDA, both bf16)."""
    return x.is_cuda and x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and _HAS_MM_OUT_DTYPE


def bf16_gemm_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """`x @ weight.T` in fp32 for bf16 operands on CUDA: one bf16 GEMM accumulating into fp32 output.
    bf16 products are exact in fp32, so this is the fp32 GEMM of the same values (up to summation
    order) without an fp32 copy of the weight or of x. None where it does not apply (CPU, other
    dtypes): the caller computes in its accumulation dtype."""
    if not bf16_gemm_applies(x, weight):
        return None
    y = torch.mm(x.reshape(-1, x.shape[-1]), weight.t(), out_dtype=torch.float32)
    return y.view(*x.shape[:-1], weight.shape[0])


@contextmanager
def quantized_weights(expert_dtype: str):
    """Linears created inside keep FP8/MXFP4 weights quantised (kernel mode, see module docstring)."""
    token = _KEEP_QUANTIZED.set(expert_dtype)
    try:
        yield
    finally:
        _KEEP_QUANTIZED.reset(token)


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype, numerics: Numerics,
                 weight_format: str = PLAIN, quantize_input: bool | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_format = weight_format
        if quantize_input is None:  # FP8/FP4 weights run as FP8 x FP8 GEMMs in the reference
            quantize_input = weight_format != PLAIN
        self.quantize_input = quantize_input and numerics.quantize_activations
        self._acc_weight: torch.Tensor | None = None  # weight in the accumulation dtype, built lazily
        keep = _KEEP_QUANTIZED.get()
        self.kernel_format: str | None = None  # "fp8" | "mxfp4" | "w8a16" in kernel mode, else None
        self._e8m0_scale: tuple | None = None  # "w8a16": (scale version, E8M0 bytes or fp32 scales)
        if keep is not None and self.quantize_input and weight_format != PLAIN:
            self.kernel_format = "mxfp4" if weight_format == EXPERT and keep == "fp4" else "fp8"
        elif keep is not None and weight_format == FP8 and quantize_input is False:
            self.kernel_format = "w8a16"  # wo_a: FP8 weight, bf16 input (dsv4.kernels.grouped_w8a16)
        if self.kernel_format is None:
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
            return
        if in_features % 128 or out_features % 128:
            raise ValueError(f"kernels='triton' needs linear dims that are multiples of 128, got "
                             f"{in_features}->{out_features}")
        if self.kernel_format == "mxfp4":
            w = torch.empty(out_features, in_features // 2, dtype=torch.int8)
            scale = torch.empty(out_features, in_features // 32, dtype=torch.uint8)
        else:
            w = torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn)
            scale = torch.empty(out_features // 128, in_features // 128, dtype=torch.float32)
        self.weight = nn.Parameter(w, requires_grad=False)
        self.register_buffer("scale", scale)

    def load_quantized(self, name: str, weight: torch.Tensor, scale: torch.Tensor) -> None:
        """Kernel mode: keep a stored (weight, scale) pair as it is (FP8 scales as fp32 values)."""
        if self.kernel_format == "mxfp4":
            if weight.dtype not in (torch.int8, torch.uint8):
                raise ValueError(f"{name}: expected packed MXFP4 (I8) expert weights, got {weight.dtype}")
            weight, scale = weight.view(torch.int8), scale.view(torch.uint8)
        else:
            from dsv4.kernels.fp8_linear import _weight_scale_f32
            if weight.dtype != torch.float8_e4m3fn:
                raise ValueError(f"{name}: expected F8_E4M3 weights, got {weight.dtype}")
            scale = _weight_scale_f32(scale, name[: -len(".weight")] + ".scale")
        for what, src, dst in (("weight", weight, self.weight), ("scale", scale, self.scale)):
            if tuple(src.shape) != tuple(dst.shape):
                raise ValueError(f"{name}: {what} shape {tuple(src.shape)}, expected {tuple(dst.shape)}")
        with torch.no_grad():
            self.weight.copy_(weight.to(self.weight.device))
            self.scale.copy_(scale.to(self.scale.device))

    def load_master(self, name: str, w: torch.Tensor) -> None:
        """Kernel mode: quantise an unquantised master weight the way the checkpoint writer does."""
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"{name}: shape {tuple(w.shape)}, expected {(self.out_features, self.in_features)}")
        if self.kernel_format == "mxfp4":
            from dsv4.quant.mxfp4 import quantize_mxfp4
            q, s = quantize_mxfp4(w.float())
        else:
            from dsv4.quant.fp8 import quantize_fp8_block
            q, s = quantize_fp8_block(w.float(), scale_dtype="float32")
        self.load_quantized(name, q, s)

    def e8m0_scale(self) -> torch.Tensor:
        """Kernel mode: the block scales as E8M0 bytes when all are powers of two (the fast path of
        dsv4.kernels.grouped_w8a16), else the float32 scales. Cached until the scales change in place
        (its first call reads a flag back from the device: not inside a CUDA-graph capture)."""
        key = (self.scale.data_ptr(), self.scale._version)
        if self._e8m0_scale is None or self._e8m0_scale[0] != key:
            from dsv4.quant.e8m0 import float_to_e8m0
            s = self.scale
            pow2 = bool(((s > 0) & (torch.frexp(s).mantissa == 0.5)).all())
            self._e8m0_scale = (key, float_to_e8m0(s).view(torch.uint8) if pow2 else s)
        return self._e8m0_scale[1]

    def acc_weight(self) -> torch.Tensor:
        acc = acc_dtype(self.weight.dtype)
        if acc == self.weight.dtype:
            return self.weight
        w = self._acc_weight
        if w is None or w.device != self.weight.device:
            w = self._acc_weight = self.weight.detach().to(acc)
        return w

    def invalidate_cache(self) -> None:
        self._acc_weight = self._e8m0_scale = None

    def _apply(self, fn, recurse=True):  # .to()/.cuda() change the weight: drop the cached copies
        self._acc_weight = self._e8m0_scale = None
        return super()._apply(fn, recurse)

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        """The GEMM input: FP8-quantised when this linear quantises activations (compute it once and
        pass `input_ready=True` when several linears share an input)."""
        if self.kernel_format is not None:
            return x  # the kernel quantises its input itself
        return quantize_activation(x) if self.quantize_input else x

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None,
                input_ready: bool = False) -> torch.Tensor:
        """y = W x accumulated in acc_dtype(x.dtype); result in out_dtype or x.dtype."""
        if self.kernel_format is not None:
            if self.kernel_format != "fp8":
                raise RuntimeError(f"{self.kernel_format} weights run only inside their kernels (fused MoE, grouped wo_a)")
            from dsv4.kernels.fp8_linear import fp8_linear
            if out_dtype == torch.float32:  # a partial sum: unrounded, like the torch path
                return fp8_linear(x, self.weight, self.scale, out_dtype=torch.float32)
            y = fp8_linear(x, self.weight, self.scale)
            return y if out_dtype is None else y.to(out_dtype)
        if not input_ready:
            x = self.prepare_input(x)
        y = bf16_gemm_fp32(x, self.weight) if acc_dtype(x.dtype) == torch.float32 else None
        if y is None:  # CPU / other dtypes: the GEMM in the accumulation dtype
            y = F.linear(x.to(acc_dtype(x.dtype)), self.acc_weight())
        return y.to(out_dtype or x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, format={self.weight_format}, " \
               f"quantize_input={self.quantize_input}, kernel={self.kernel_format}"


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
