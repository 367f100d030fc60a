"""FP8 block linear for a single token on CUDA cores (decode at batch 1, the MTP draft).

Same contract and numerics as the M = 1 path of `dsv4.kernels.fp8_linear` (activation quantised per
128 channels with power-of-two scales, e4m3 x e4m3 products summed in fp32 per 128-block, times the
activation and weight block scales, blocks summed in fp32). One program per `bn` weight rows streams
its rows once; no split-K partials, no reduce launch. Only the summation order inside a block
differs (a reduction tree instead of an MMA).
"""

from __future__ import annotations

import torch

from dsv4.kernels._triton import HAS_TRITON
from dsv4.kernels.moe_gemv import blocks_per_step

if HAS_TRITON:
    import triton
    import triton.language as tl

    from dsv4.kernels.fp8_linear import _e8m0_to_f32, _quant_rows

    @triton.jit
    def _fp8_gemv_kernel(A, SA, W, SW, C, K, stride_wn, stride_swn,
                         BN: tl.constexpr, FUSE_QUANT: tl.constexpr, SW_E8M0: tl.constexpr, UNROLL: tl.constexpr):
        """C[n] = sum over 128-blocks kb of (sum_k a_q[k] w[n, k]) * (s_w[n // 128, kb] * s_a[kb])."""
        pid = tl.program_id(0)
        offs_n = pid * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, 128)
        w_ptrs = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
        s_row = SW + (pid * BN // 128) * stride_swn  # BN <= 128: one weight-scale row per program
        acc = tl.zeros((BN,), dtype=tl.float32)
        for kb0 in range(0, K // 128, UNROLL):
            for u in tl.static_range(UNROLL):  # loads of UNROLL blocks issued before their use
                kb = kb0 + u
                w = tl.load(w_ptrs + kb * 128)
                sw = tl.load(s_row + kb)
                if SW_E8M0:
                    sw = _e8m0_to_f32(sw.to(tl.int32))
                if FUSE_QUANT:  # every program quantises the (small) activation row itself
                    q, sa = _quant_rows(tl.load(A + kb * 128 + offs_k)[None, :].to(tl.float32))
                    sa = tl.sum(sa, axis=0)
                else:
                    q = tl.load(A + kb * 128 + offs_k)[None, :]
                    sa = tl.load(SA + kb)
                part = tl.sum(w.to(tl.float32) * q.to(tl.float32), axis=1)
                acc += part * (sw * sa)
        tl.store(C + offs_n, acc.to(C.dtype.element_ty))


def launch_fp8_gemv(a: torch.Tensor, sa: torch.Tensor, weight: torch.Tensor, sw: torch.Tensor, sw_e8m0: bool,
                    out: torch.Tensor, fuse_quant: bool, bn: int, unroll: int, num_warps: int) -> None:
    """One token: a [1, K] (bf16 when fuse_quant, else e4m3 with scales sa [1, K/128]) x weight [N, K]
    -> out [1, N] (bf16 or fp32); sw: the weight's block scales as `_fp8_gemm_kernel` takes them."""
    n, k = weight.shape
    if a.shape[0] != 1 or n % bn or bn > 128 or 128 % bn:
        raise ValueError(f"fp8 gemv: one row and bn dividing 128 and N={n} expected, got {tuple(a.shape)}, bn={bn}")
    _fp8_gemv_kernel[(n // bn,)](a, sa, weight, sw, out, k, weight.stride(0), sw.stride(0), BN=bn,
                                 FUSE_QUANT=fuse_quant, SW_E8M0=sw_e8m0, UNROLL=blocks_per_step(k, unroll),
                                 num_warps=num_warps, num_stages=1)
