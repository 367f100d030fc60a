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
storage here: `MoE.pack_experts` moves them into the fused MoE kernel's layout. FP8 linears that read
one input can be row-stacked into one weight (`stack_fp8_linears`) and run as one GEMM whose output
columns are bit for bit those of the separate GEMMs (`stacked_fp8_forward`).
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

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
                raise RuntimeError(f"{self.kernel_format} weights run only inside their kernels "
                                   "(fused MoE, grouped wo_a)")
            return fp8_matmul(x, self.weight, self.scale, out_dtype)
        if not input_ready:
            x = self.prepare_input(x)
        y = bf16_gemm_fp32(x, self.weight) if acc_dtype(x.dtype) == torch.float32 else None
        if y is None:  # CPU / other dtypes: the GEMM in the accumulation dtype
            y = F.linear(x.to(acc_dtype(x.dtype)), self.acc_weight())
        return y.to(out_dtype or x.dtype)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}, format={self.weight_format}, " \
               f"quantize_input={self.quantize_input}, kernel={self.kernel_format}"


def fp8_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype | None = None,
               config=None) -> torch.Tensor:
    """Kernel mode's FP8 GEMM, `dsv4.kernels.fp8_linear.fp8_linear` (looked up at call time, so a
    reference swapped in for it serves every caller): bf16 out (or out_dtype), fp32 unrounded for a partial sum.
    `config`: an explicit launch config (`stacked_fp8_forward`)."""
    from dsv4.kernels.fp8_linear import fp8_linear
    kw = {} if config is None else {"config": config}
    if out_dtype == torch.float32:  # a partial sum: unrounded, like the torch path
        return fp8_linear(x, weight, scale, out_dtype=torch.float32, **kw)
    y = fp8_linear(x, weight, scale, **kw)
    return y if out_dtype is None else y.to(out_dtype)


class FP8Stack(NamedTuple):
    """FP8 kernel-format linears that read one input, row-stacked (`stack_fp8_linears`)."""
    weight: torch.Tensor         # e4m3 [sum of out_features, in]
    scale: torch.Tensor          # fp32 [sum of out_features / 128, in / 128]
    linears: tuple               # the Linears, in row order
    aliases: tuple[int, ...]     # their weight and scale addresses: row views of the stack

    def intact(self) -> bool:
        """Whether every linear still computes from its rows of the stack (a `.to()` or a new
        Parameter since stacking replaces a weight; an in-place load writes through)."""
        return _addresses(self.linears) == self.aliases


def _addresses(linears) -> tuple[int, ...]:
    return tuple(p for lin in linears for p in (lin.weight.data_ptr(), lin.scale.data_ptr()))


def stack_fp8_linears(linears: list[Linear]) -> FP8Stack | None:
    """Row-stack FP8 kernel-format linears of one input into one weight and scale. Exact: the scales
    are per 128x128 block and out_features are multiples of 128, so no block straddles two linears.
    Each linear's weight and scale become its row views of the stack (no second copy; a later
    `load_quantized` writes through). None, with nothing changed, unless every linear is "fp8" with
    the same input width, scale dtype and device."""
    first = linears[0]
    if any(lin.kernel_format != "fp8" or lin.weight.shape[1] != first.weight.shape[1] or lin.weight.numel() == 0
           or lin.scale.dtype != first.scale.dtype or lin.weight.device != first.weight.device for lin in linears):
        return None
    with torch.inference_mode(False), torch.no_grad():  # normal tensors: later loads copy into them
        weight = torch.cat([lin.weight.detach() for lin in linears])
        scale = torch.cat([lin.scale for lin in linears])
        row = 0
        for lin in linears:
            n = lin.weight.shape[0]
            lin.weight = nn.Parameter(weight[row:row + n], requires_grad=False)
            lin.scale = scale[row // 128:(row + n) // 128]
            lin.invalidate_cache()
            row += n
    return FP8Stack(weight, scale, tuple(linears), _addresses(linears))


@lru_cache(maxsize=1024)
def _stacked_launch(m: int, widths: tuple[int, ...], k: int):
    """The `fp8_linear` launch config under which one GEMM over the stacked weights computes every
    output element as the linear's own launch does, or None. The kernel's per-element arithmetic
    depends on the tile config (a function of m) and on its split of K (a function of the number of
    output tiles): the split partials are summed in another order. The one-row GEMV's likewise
    (`pick_gemv_config`, split included). So the parts must agree on both,
    and the stacked launch gets their split explicitly. From CUBLAS_MIN_ROWS rows the parts run cuBLAS,
    whose summation order may depend on the output width: no stacked launch there."""
    from dsv4.kernels.fp8_linear import CUBLAS_MIN_ROWS, launch_split, pick_gemv_config, pick_linear_config
    if m >= CUBLAS_MIN_ROWS:
        return None
    gemvs = {pick_gemv_config(m, n, k) for n in widths}  # one row: the GEMV's configs carry their split
    if gemvs != {None}:
        return gemvs.pop() if len(gemvs) == 1 else None
    configs = {pick_linear_config(m, n, k) for n in widths}
    if len(configs) != 1:
        return None
    config = configs.pop()
    splits = {launch_split(m, n, k, config) for n in widths}
    return replace(config, split_k=splits.pop()) if len(splits) == 1 else None


def stacked_fp8_forward(stack: FP8Stack, x: torch.Tensor) -> list[torch.Tensor] | None:
    """Each linear's `forward(x)` (bf16) as column views of one GEMM over the stack, bit for bit; None
    (run the linears) when the stack is no longer intact or no single launch matches the separate
    launches' arithmetic (see `_stacked_launch`)."""
    if not stack.intact():
        return None
    widths = tuple(lin.weight.shape[0] for lin in stack.linears)
    config = _stacked_launch(x.numel() // x.shape[-1], widths, x.shape[-1])
    if config is None:
        return None
    return list(fp8_matmul(x, stack.weight, stack.scale, config=config).split(widths, dim=-1))


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
