"""cuBLAS's blockwise FP8 GEMM (`torch._scaled_mm` with 1x128 activation and 128x128 weight scales) on
`act_quant`'s output, for `fp8_linear` from `fp8_linear.CUBLAS_MIN_ROWS` rows (prefill sizes). The same math
as the Triton GEMM: exact e4m3 products summed per 128-block, scaled, fp32 sums (another order)."""
from __future__ import annotations

import logging
from collections import OrderedDict

import torch

from dsv4.kernels.fp8_linear import BLOCK, _launch_act_quant, _weight_scale_f32

log = logging.getLogger(__name__)

CUBLAS_MIN_FEATURES = 512  # cuBLAS 13 refused N = 128 and K = 128 / 256 (CUBLAS_STATUS_NOT_SUPPORTED, s12a)
_CUBLAS_REJECTED: set = set()  # (m, n, k) cuBLAS refused once (the Triton GEMM runs them)
_F32_SCALES: OrderedDict = OrderedDict()  # E8M0 weight scales decoded for cuBLAS, most recent last


def _cublas_weight_scale(scale: torch.Tensor) -> torch.Tensor:
    """fp32 128x128 weight scales for cuBLAS, decoded once per E8M0 tensor (and again after an in-place
    write, which bumps its version). The entry holds the source tensor, so while cached no other storage
    can take its address (a hit is the same bytes, maybe through another view); least recently used
    entries go beyond 4096 (a V4-Pro stack has ~1,000 linears)."""
    if scale.dtype == torch.float32:
        return scale
    key = (scale.data_ptr(), tuple(scale.shape), scale._version)
    hit = _F32_SCALES.get(key)
    if hit is not None:
        _F32_SCALES.move_to_end(key)
        return hit[1]
    f32 = _weight_scale_f32(scale)
    _F32_SCALES[key] = (scale, f32)
    if len(_F32_SCALES) > 4096:
        _F32_SCALES.popitem(last=False)
    return f32


def cublas_fp8_linear(x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """bf16 [M, N] of a 2-D bf16 x2 by `act_quant`'s kernel + cuBLAS blockwise `_scaled_mm`; None where this
    torch / cuBLAS build rejects the shape (logged once per shape; the caller runs the Triton GEMM)."""
    (m, k), n = x2.shape, weight.shape[0]
    key = (m, n, k)
    if key in _CUBLAS_REJECTED or min(n, k) < CUBLAS_MIN_FEATURES:
        return None
    # cuBLAS wants the 1x128 scales outer-dim-major ([K/128, M] transposed) and refused M = 255 (s12b):
    # rows padded to a multiple of 16, pad rows left unwritten (their output rows are cut off)
    mp = -(-m // 16) * 16
    q = torch.empty((mp, k), dtype=torch.float8_e4m3fn, device=x2.device)
    s = torch.empty((k // BLOCK, mp), dtype=torch.float32, device=x2.device).t()
    _launch_act_quant(x2, q, s, m)
    try:
        return torch._scaled_mm(q, weight.t(), scale_a=s, scale_b=_cublas_weight_scale(scale).t(),
                                out_dtype=torch.bfloat16)[:m]
    except (RuntimeError, NotImplementedError) as err:
        log.info("cuBLAS blockwise FP8 GEMM rejected %s (%s); Triton GEMM instead",
                 key, str(err).splitlines()[0] if str(err) else type(err).__name__)
        _CUBLAS_REJECTED.add(key)
        return None
